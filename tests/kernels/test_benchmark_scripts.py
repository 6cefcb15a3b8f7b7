"""The GPU benchmark scripts under ``kernels/benchmarks`` import on a CPU machine (their GPU work only starts in
``main``), so that a carried snapshot does not fail on an import at the start of a device call; ``ab_kda``'s setting
parser and its constants' save and restore."""

from __future__ import annotations

import importlib
import json
import pkgutil
import runpy
from pathlib import Path

import pytest
import torch

import kernels.benchmarks as benchmarks


@pytest.mark.parametrize("name", sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__)))
def test_benchmark_module_imports(name):
    mod = importlib.import_module(f"kernels.benchmarks.{name}")
    assert mod.__doc__, f"kernels/benchmarks/{name}.py has no docstring saying how to run it"


def test_kda_constants_parse_set_and_restore(tmp_path, monkeypatch):
    """``bench_kda``'s constants (``ab_kda --set``, the sweeps' settings, ``--set-file``): parsed as Python literals,
    set on whichever KDA kernel module defines them, restored after a ``with`` block even when it raises; an unknown
    name stops with its name."""
    from kernels.benchmarks.bench_kda import apply_constants, kda_constants, parse_constants
    from kernels.kda import chunk_triton, chunk_triton_bwd

    setting = parse_constants(["SCORES2_BK=32", "BWD_DY_BV = 64", "SCORES2_LAUNCH=(4, 2)"], "test")
    assert setting == {"SCORES2_BK": 32, "BWD_DY_BV": 64, "SCORES2_LAUNCH": (4, 2)}
    now = lambda: (chunk_triton.SCORES2_BK, chunk_triton_bwd.BWD_DY_BV, chunk_triton.SCORES2_LAUNCH)  # noqa: E731
    before = now()
    with pytest.raises(RuntimeError), kda_constants(setting):
        assert now() == (32, 64, (4, 2))
        raise RuntimeError
    assert now() == before
    with pytest.raises(SystemExit, match="NO_SUCH_CONSTANT"):
        parse_constants(["NO_SUCH_CONSTANT=1"], "test")
    f = tmp_path / "consts.txt"
    f.write_text("SCORES2_BK=32\n\nBWD_DY_BV=64\n")
    monkeypatch.setattr(chunk_triton, "SCORES2_BK", chunk_triton.SCORES2_BK)  # restored after the test
    monkeypatch.setattr(chunk_triton_bwd, "BWD_DY_BV", chunk_triton_bwd.BWD_DY_BV)
    assert apply_constants(str(f)) == {"SCORES2_BK": 32, "BWD_DY_BV": 64}
    assert (chunk_triton.SCORES2_BK, chunk_triton_bwd.BWD_DY_BV) == (32, 64)


@pytest.mark.parametrize("sweep", ["sweep_kda_fwd", "sweep_kda_bwd"])
def test_sweep_settings_name_existing_constants(sweep):
    """Every setting of the KDA sweeps names constants the kernel modules still define (a removed constant would
    otherwise fail only on the GPU, in the middle of a sweep), under distinct names without a comma (``--only``
    splits its list at commas)."""
    from kernels.benchmarks.bench_kda import kda_constants

    settings = importlib.import_module(f"kernels.benchmarks.{sweep}").SETTINGS
    assert settings
    names = [name for name, *_ in settings]
    assert len(set(names)) == len(names), "two settings share a name"
    for name, consts, *_launch in settings:  # sweep_kda_bwd's third item: BWD_LAUNCH overrides
        assert "," not in name, name
        with kda_constants(consts):
            pass


def test_graph_ms_records_a_failed_capture(monkeypatch):
    """``bench_kda.graph_ms`` returns why a function could not be replayed as a CUDA graph instead of stopping the
    benchmark (the capture is made to fail the same way with and without a GPU)."""
    import triton.testing

    from kernels.benchmarks.bench_kda import graph_ms

    def refuse(fn, **kw):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", refuse)
    out = graph_ms(lambda: None)
    assert out == "capture failed: RuntimeError: operation not permitted when stream is capturing", out


def test_bench_init_gates_match_a_fresh_model_layer(monkeypatch):
    """``bench_kda --gates init`` draws gates like the ``small`` flavor's KDA layer at initialisation
    (``scripts/kda_gate_spans.py``'s ``flavor_gates``; the 99.9th
    percentile of the per-step |g|, which sets how often the kernels' pairwise paths run, within a factor 1.5;
    seeds move it by ~1.4x), unlike the benchmark's default gates (over 3x sharper); an unknown name is refused."""
    from kernels.benchmarks import bench_kda
    from kimi_vl.modeling.kda_layer import kda_gate_torch

    def tail(g: torch.Tensor) -> float:
        return float(g.abs().flatten().quantile(0.999))

    def bench_tail(gates: str) -> float:
        monkeypatch.setattr(bench_kda, "GATES", gates)
        _, _, _, g, _, a_log, dt_bias = bench_kda.make(1, 2048, 6, dev="cpu")
        return tail(kda_gate_torch(g, a_log, dt_bias, None))

    torch.manual_seed(0)  # the small layer's gates, as scripts/kda_gate_spans.py --flavor small draws them
    spans = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "kda_gate_spans.py"))
    model = tail(spans["flavor_gates"]("small", 1, 2048))
    init, default = bench_tail("init"), bench_tail("bench")
    assert 1 / 1.5 < init / model < 1.5, (init, model)
    assert default > 3 * model, (default, model)
    monkeypatch.setattr(bench_kda, "GATES", "sharp")
    with pytest.raises(ValueError, match="GATES"):
        bench_kda.make(1, 64, 1, dev="cpu")


def test_gpu_clocks_summary(tmp_path):
    """``scripts/gpu_clocks.py``: busy samples' power and clock medians, the limits, the share of samples with each
    clock-event reason (the power cap here); idle samples left out; the header's names for the current clocks
    (``clocks.current.sm``) read as the queried ones."""
    clocks = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "gpu_clocks.py"))
    rows = [{"utilization.gpu": "100", "power.draw": "690.5", "power.limit": "700.00", "clocks.sm": "1755",
             "clocks.max.sm": "1980", "clocks_event_reasons.active": "0x0000000000000004"},
            {"utilization.gpu": "100", "power.draw": "650.0", "power.limit": "700.00", "clocks.current.sm": "1980",
             "clocks.max.sm": "1980", "clocks_event_reasons.active": "0x0000000000000000"},
            {"utilization.gpu": "0", "power.draw": "90.0", "power.limit": "700.00", "clocks.sm": "345",
             "clocks.max.sm": "1980", "clocks_event_reasons.active": "0x0000000000000001"}]
    s = clocks["summarize"](rows, 90.0)
    assert s["busy_samples"] == 2 and s["power.draw"]["median"] == pytest.approx(670.25)
    assert s["clocks.sm"]["min"] == 1755 and s["power.limit"] == 700 and s["clocks.max.sm"] == 1980
    assert s["reason_share"]["sw_power_cap"] == 0.5 and s["reason_share"]["gpu_idle"] == 0.0


def test_backbone_summary(tmp_path):
    """``scripts/backbone_summary.py``: the step and MFU lines, the categories, and only the asked category's kernels
    of a ``bench_backbone --profile`` JSON."""
    summary = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "backbone_summary.py"))["summary"]
    kernels = [{"name": "_bwd_inter_kernel", "ms": 5.833, "calls": 9, "category": "kda"},
               {"name": "nvjet_x", "ms": 9.4, "calls": 49, "category": "gemm"}]
    run = {"train": {"hybrid": [{"step_s": 0.08, "mfu": 0.318, "step_s_device_bound": 0.0795,
                                 "mfu_device_bound": 0.321, "peak_mem_gib": 20.63}]},
           "profile": {"hybrid": {"gpu_ms": 78.8, "categories_ms": {"gemm": 31.5, "kda": 24.1},
                                  "top_kernels": kernels}}}
    path = tmp_path / "bench_backbone.json"
    path.write_text(json.dumps(run))
    lines = summary(str(path), "kda").splitlines()
    assert lines[0] == ("step 80.00 ms (MFU 31.8%), device-bound 79.50 ms (MFU 32.1%); kernels 78.80 ms; "
                        "peak 20.63 GiB")
    assert lines[1] == "{'gemm': 31.5, 'kda': 24.1}"
    assert lines[2:] == ["  5.833 ms 9 calls _bwd_inter_kernel"]


def test_pick_piece_weights(tmp_path):
    """``scripts/pick_piece_weights.py`` compares each weighting with the near-equal pieces of its count in the same
    sweep, takes the lowest mean ratio over the shapes that timed both, leaves out a count whose equal pieces win,
    and ignores settings that change other constants."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    def sweep(shape, rows):
        path = tmp_path / f"{shape}.json"
        path.write_text(json.dumps({"shape": shape, "settings": {
            name: {"fwd_graph_ms": ms, "consts": consts} for name, ms, consts in rows}}))
        return str(path)

    two = lambda w: {"FWD_PIECES": 2, "PIECE_WEIGHTS": {"2": w}}  # noqa: E731 - as sweep_kda_fwd's JSON holds them
    four = lambda w: {"FWD_PIECES": 4, "PIECE_WEIGHTS": {"4": w}}  # noqa: E731
    a = sweep("1x8192x32", [("default", 1.0, {}), ("pieces 2", 1.0, {"FWD_PIECES": 2, "PIECE_WEIGHTS": {}}),
                            ("pieces 2 w3:1", 0.96, two([3.0, 1.0])), ("pieces 2 w4:1", 0.97, two([4.0, 1.0])),
                            ("pieces 2 bv16", 0.5, {"FWD_PIECES": 2, "STATE_BV": 16})])
    b = sweep("2x16384x16", [("pieces 2", 2.0, {"FWD_PIECES": 2, "PIECE_WEIGHTS": {}}),
                             ("pieces 2 w3:1", 1.98, two([3.0, 1.0])), ("pieces 2 w4:1", 1.9, two([4.0, 1.0]))])
    c = sweep("1x32768x16", [("pieces 4", 2.0, {"FWD_PIECES": 4, "PIECE_WEIGHTS": {}}),
                             ("pieces 4 w4:3:2:1", 2.1, four([4.0, 3.0, 2.0, 1.0]))])
    out = tmp_path / "set.txt"
    script = Path(__file__).resolve().parents[2] / "scripts" / "pick_piece_weights.py"
    run = subprocess.run([sys.executable, str(script), a, b, c, "--out", str(out)],
                         capture_output=True, text=True, check=True)
    assert out.read_text() == "PIECE_WEIGHTS={2: (4.0, 1.0)}\n", run.stdout  # 4:1 0.960 mean against 3:1 0.975


def test_swiglu_config_line_replaces_the_module_line():
    """``bench_swiglu --sweep`` writes its best tiling as a ``GPU_CONFIG = ...`` line that the GPU script puts in place
    of the one line of ``kernels/swiglu/swiglu_triton.py`` starting so (``sed s/^GPU_CONFIG = .*/LINE/``): the line
    must evaluate to the configurations it names, and the module must have exactly one such line."""
    from kernels.benchmarks.bench_swiglu import config_line
    from kernels.swiglu import swiglu_triton
    from kernels.swiglu.swiglu_triton import GemmConfig

    fwd, bwd = GemmConfig(64, 256, 32, 4, 8, 5), GemmConfig(256, 128, 64, 16, 4, 2)
    line = config_line(fwd, bwd)
    scope = {"GemmConfig": GemmConfig}
    exec(line, scope)
    assert scope["GPU_CONFIG"] == {"fwd": fwd, "bwd": bwd}
    assert "/" not in line and "&" not in line  # sed's special characters
    source = Path(swiglu_triton.__file__).read_text().splitlines()
    assert sum(s.startswith("GPU_CONFIG = ") for s in source) == 1


def test_bench_swiglu_runs_end_to_end_with_stub_timers(tmp_path, monkeypatch):
    """``bench_swiglu.py --sweep``'s logic on a CPU (interpreter, stub timers that call each function once): the JSON
    has every part, both paths' errors (bf16-sized), the sweep's rows and best pair, the whole MLP under that pair,
    and the ``GPU_CONFIG`` line file; the module's configuration is restored."""
    from kernels.benchmarks import bench_swiglu as bs
    from kernels.swiglu import swiglu_triton as st

    calls = iter(range(1, 10_000))

    def stub(fn):
        fn()
        return float(next(calls))  # distinct times: the first tiling of each sweep is the fastest

    monkeypatch.setattr(bs, "DEVICE", "cpu")
    monkeypatch.setattr(bs, "graph_ms", stub)
    monkeypatch.setattr(bs, "eager_ms", stub)
    monkeypatch.setattr(bs, "FWD_SWEEP", [(32, 16, 16, 2, 4, 1), (16, 16, 16, 1, 4, 1)])
    monkeypatch.setattr(bs, "BWD_SWEEP", [(16, 32, 16, 2, 4, 1), (16, 16, 32, 1, 4, 1)])
    before = dict(st.GPU_CONFIG)
    out = tmp_path / "bench_swiglu.json"
    bs.main(["--rows", "40", "--dims", "32,48", "--sweep", "--out", str(out)])
    res = json.loads(out.read_text())
    assert st.GPU_CONFIG == before
    assert {"gate_up_gemm", "fused_fwd_kernel", "dh_gemm", "fused_bwd_kernel", "fwd_ratio"} <= set(res["parts"])
    for impl in ("split", "fused"):
        assert set(res["errors"][impl]) == {"y", "dx", "dw_gate_up", "dw_down"}
    # bf16: the interpreter truncates fp32 -> bf16 (about 2.5x the GPU's rounding error here); garbage would be >> 1
    assert max(res["errors"]["fused"].values()) < 0.03 and max(res["errors"]["split"].values()) < 0.03
    assert [r["config"] for r in res["sweep"]["fwd"]] == [[32, 16, 16, 2, 4, 1], [16, 16, 16, 1, 4, 1]]
    assert res["sweep"]["best_fwd"] == [32, 16, 16, 2, 4, 1] and res["sweep"]["best_bwd"] == [16, 32, 16, 2, 4, 1]
    assert {"fwd_ms", "fwd_bwd_ms"} <= set(res["fused_best"])
    line = (tmp_path / "swiglu_gpu_config.txt").read_text().strip()
    assert line == res["best_config_line"] and line.startswith("GPU_CONFIG = ")
