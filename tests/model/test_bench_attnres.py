"""``kimi_vl.benchmarks.bench_attnres`` helpers on the CPU: the traffic model and the stream-cost section run and
report what the GPU run reports (the timings themselves are GPU-only)."""

from __future__ import annotations

import pytest
import torch

from kimi_vl import KimiVLConfig
from kimi_vl.benchmarks.attnres_decode import bench_stream_cost, decode_lines
from kimi_vl.benchmarks.bench_attnres import mix_traffic


def test_mix_traffic_of_the_small_flavor():
    """24 sublayers in blocks of 6 at 8 x 4096 x 768 bf16: deferring the block states' gradients moves less than
    per-mix sinks, which move less than autograd's accumulation; the forward is the same for all."""
    t = mix_traffic(24, 6, 8 * 4096 * 768 * 2)
    assert t["forward"] == pytest.approx(5.436, abs=1e-3)
    assert t["backward_deferred"] < t["backward_sinks"] < t["backward_no_sinks"]
    assert t["backward_deferred"] == pytest.approx(9.362, abs=1e-3)


def test_stream_cost_reports_both_streams():
    cfg = KimiVLConfig.from_flavor("debug", residual_mode="attnres_block")
    out = bench_stream_cost(cfg, torch.device("cpu"), torch.float32, tokens=2, rounds=1, launches=2)
    for key in ("standard_host_us", "standard_synced_us", "attnres_block_host_us", "attnres_block_synced_us",
                "launch_add_us", "launch_phase2_us", "overhead_host_us_pct"):
        assert out[key] > (-100 if key.startswith("overhead") else 0), key
    assert out["sublayers"] == cfg.num_sublayers and out["block_size"] == cfg.attnres_block_size


def test_decode_lines_report_the_median_of_round_ratios():
    """The decode table shows the best rounds' overhead and the median of the per-round ratios beside it."""
    dec = {"context": 4096, "steps": 32, "standard_tokens_per_s": 100.0, "attnres_block_tokens_per_s": 98.0,
           "overhead_pct": 2.04, "round_ratios": [1.01, 1.03, 0.99], "overhead_median_pct": 1.0}
    text = "\n".join(decode_lines("hybrid", dec))
    assert "standard 100.0 vs two-phase Triton 98.0 tok/s | | | +2.0%" in text
    assert "decode, median of 3 per-round ratios | | | +1.0%" in text


def test_graph_decode_bench_runs_its_variants_on_cpu(monkeypatch):
    """The graph-decode benchmark's bookkeeping on the CPU (eager static-cache steps, debug flavor): both residuals
    with and without the fused norms (the standard's fused add + norm through the Triton norm in the interpreter),
    interleaved rounds, the decode-step profiles and the table rows."""
    import argparse

    from kimi_vl.benchmarks.attnres_decode import GRAPH_VARIANTS, bench_graph_decode
    from kimi_vl.benchmarks.bench_attnres import _build, _config

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KVL_ATTNRES_TWO_PHASE", "triton")
    monkeypatch.setenv("KVL_NORM_BACKEND", "triton")
    models = {r: _build(_config("debug", "hybrid", r), torch.device("cpu"), torch.float32)
              for r in ("standard", "attnres_block")}
    args = argparse.Namespace(decode_steps=2, graph_rounds=2, decode_context=6, profile=True, profile_top=3)
    out = bench_graph_decode(models, _config("debug", "hybrid", "standard"), args, torch.device("cpu"))
    assert len(out["round_ratios"]) == 2 and len(out["unfused_round_ratios"]) == 2
    assert all(out[f"{name}_tokens_per_s"] > 0 for name in GRAPH_VARIANTS)
    assert out["kernel_diff"][0]["name"] == "(total)" and out["kernel_diff_unfused"]
    assert out["kernel_diff_standard_fused"][0]["name"] == "(total)"
    text = "\n".join(decode_lines("hybrid", out, "CUDA-graph decode"))
    assert "separate norm launches (KVL_FUSED_NORM=0)" in text


def test_restructured_traffic_of_the_small_flavor():
    """In state passes (state_bytes = 1 GB): today's forward and deferred backward as ``mix_traffic`` counts them
    (108 + 186); the two-phase forward 93 (blocks 2 and 3 save 5 and 10, blocks 0 and 1 keep today's mixes); the
    h-identity backward 162 (blocks 1-3 save 2, 8 and 14; block 0 keeps today's). A single block (only the
    embedding completed) keeps today's forms."""
    from kimi_vl.benchmarks.bench_attnres import restructured_traffic

    t = restructured_traffic(24, 6, 10**9)
    small = mix_traffic(24, 6, 10**9)
    assert (t["forward"], t["backward_deferred"]) == (small["forward"], small["backward_deferred"]) == (108, 186)
    assert (t["forward_two_phase"], t["backward_h_identity"]) == (93, 162)
    one = restructured_traffic(24, 24, 10**9)
    assert (one["forward_two_phase"], one["backward_h_identity"]) == (one["forward"], one["backward_deferred"])


def test_h_identity_loses_the_query_gradient_with_a_bf16_h():
    """``attnres_h_identity``: the mix kernels' fp32 sum over the sources gives the query's gradient to ~1e-6 of
    fp64; replacing it by ``dh . h`` with the stored bf16 h loses percents once the weights concentrate on the
    partial sum (why the deferred backward of ``restructured_traffic`` is not built)."""
    from kimi_vl.benchmarks.attnres_h_identity import measure

    rows = measure(tokens=256, dim=768, scales=(0.0, 0.3))
    for r in rows:
        assert r["du_rel_err_sources"] < 1e-5 and r["dx_rel_err_sources"] < 1e-5
    peaked = rows[-1]
    assert peaked["mean_alpha_partial"] > 0.9 and peaked["du_rel_err_h_bf16"] > 1e-2


def test_set_mix_constants(monkeypatch):
    """``--set NAME=VALUE`` sets a mix_triton constant for the run; an unknown name, a module attribute that is not a
    constant, or a non-literal value is refused with the pair in the message."""
    from kernels.attn_res import mix_triton as mt
    from kimi_vl.benchmarks.bench_attnres import _set_mix_constants

    monkeypatch.setattr(mt, "BWD_PROGRAMS_PER_SM", mt.BWD_PROGRAMS_PER_SM)  # restored after the test
    _set_mix_constants(["BWD_PROGRAMS_PER_SM=4"])
    assert mt.BWD_PROGRAMS_PER_SM == 4
    for bad in ("NO_SUCH_CONSTANT=1", "BWD_PROGRAMS_PER_SM=four", "torch=1"):
        with pytest.raises(SystemExit, match=bad.split("=")[0]):
            _set_mix_constants([bad])


def test_bwd_sweep_times_configurations_round_robin(monkeypatch):
    """``--bwd-sweep`` runs every configuration once for its error, then times them in turns: each timed row has
    ``SWEEP_ROUNDS`` times and their median; a configuration that fails keeps its error and gets no time; the
    constants are restored afterwards (the Triton kernels under the interpreter, tiny sizes)."""
    from kernels.attn_res import mix_triton as mt
    from kimi_vl.benchmarks import bench_attnres as ba

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(ba, "SWEEP_ROUNDS", 2)
    monkeypatch.setattr(ba, "SWEEPS", {"backward": [{}, {"BWD_PREFETCH": 1}, {"BWD_MAX_CHUNKS": "bad"}]})
    before = mt.BWD_PREFETCH
    rows = ba.bench_bwd_sweep(16, 32, [2], torch.device("cpu"), torch.float32, 1, ("backward",))
    assert [r["config"] for r in rows] == ["default", {"BWD_PREFETCH": 1}, {"BWD_MAX_CHUNKS": "bad"}]
    for row in rows[:2]:
        assert len(row["ms_rounds"]) == 2 and row["ms"] == sum(row["ms_rounds"]) / 2  # the median of two
        assert row["rel_err_vs_default"] < 1e-6
    assert "error" in rows[2] and "ms" not in rows[2]
    assert mt.BWD_PREFETCH == before and mt.BWD_MAX_CHUNKS != "bad"
