"""Host work per decoded token (``kimi_vl/benchmarks/decode_ops.py``) on the GPU's kernel path, counted on the CPU:
block AttnRes replaces the residual adds by one two-phase launch per sublayer and stays within a few operators of
the standard residual (decode is launch-bound on a GPU, so these counts are its cost)."""

from __future__ import annotations

import pytest

from kimi_vl import KimiVLConfig
from kimi_vl.benchmarks.decode_ops import ops_per_token
from kimi_vl.benchmarks.op_count import GPU_PATH_ENV, count_triton_launches


@pytest.fixture
def gpu_path(monkeypatch):
    for k, v in GPU_PATH_ENV.items():
        monkeypatch.setenv(k, v)
    count_triton_launches()


def test_attnres_decode_costs_one_launch_per_sublayer_instead_of_an_add(gpu_path, monkeypatch):
    cfg = KimiVLConfig.from_flavor("debug")
    sublayers = 2 * cfg.num_hidden_layers
    kernels = ("triton:_phase1_kernel", "triton:_phase1_rows_kernel", "triton:_phase2_kernel")
    counts = {}
    for fused in ("0", "1"):
        monkeypatch.setenv("KVL_FUSED_NORM", fused)
        std, res = (ops_per_token("debug", mode, prompt=8) for mode in ("standard", "attnres_block"))
        counts[fused] = std, res
        assert std["triton_launches"] > 0, "the Triton kernels were not taken (or not counted)"
        phase = sum(res["counts"].get(name, 0) for name in kernels)
        assert phase == sublayers + 1  # every sublayer's input and the output mix
        assert res["counts"].get("triton:_phase1_rows_kernel", 0) > 0  # decode: one program per token
        assert not any(name in std["counts"] for name in kernels)
        # a fixed set-up per token (block-state buffer, query product, one h buffer): 13 ops in session 11; without
        # the reused h buffer, one allocation per sublayer more
        assert res["ops"] - std["ops"] <= 16, (fused, res["ops"], std["ops"])
    (std0, res0), (std1, res1) = counts["0"], counts["1"]
    assert std0["counts"]["aten.add"] - res0["counts"].get("aten.add", 0) == sublayers  # phase launches absorb adds
    # KVL_FUSED_NORM=1: the standard residual's adds go into its norm launches, AttnRes's norms into its phase ones
    assert std0["counts"]["aten.add"] - std1["counts"].get("aten.add", 0) == sublayers
    assert std1["counts"]["triton:_norm_fwd_kernel"] == std0["counts"]["triton:_norm_fwd_kernel"]
    norms0, norms1 = (r["counts"].get("triton:_norm_fwd_kernel", 0) for r in (res0, res1))
    assert norms0 - norms1 == sublayers + 1
    assert std1["ops"] < std0["ops"] and res1["ops"] < res0["ops"]
    # fused: as many launches as the standard residual, and no more host operators (the queries' u is formed in
    # the kernels from the parameters' addresses: no stacks, casts or products per token)
    assert res1["triton_launches"] == std1["triton_launches"] and res1["ops"] <= std1["ops"], (res1["ops"], std1["ops"])


def test_decode_builds_no_launch_tables_per_token(gpu_path):
    """The KDA decode's dense-batch launch tables (sequence starts, lengths, a stand-in pointer) are cached per
    (B, T, device): a warm decode step builds none of them (they were 4 operators per KDA layer and token)."""
    counts = ops_per_token("debug", "standard", prompt=8)["counts"]
    assert counts.get("triton:_recurrent_kernel", 0) > 0, "the KDA decode kernel did not run"
    for op in ("aten.arange", "aten.full", "aten.zeros"):
        assert op not in counts, (op, counts.get(op))

