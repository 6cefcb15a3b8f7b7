"""The step profiler (kimi_vl/benchmarks/profile_train_step.py) runs the app's step on the CPU and reports phases."""

from __future__ import annotations

import json

import pytest
import torch

from kimi_vl.benchmarks import app_loop
from kimi_vl.benchmarks import profile_train_step as prof

FAST = ["data.seq_len=128", "data.batch_size=2", "data.max_patches=64", "data.num_workers=0"]


def test_summarise_takes_medians_per_phase():
    steps = [{"forward": 1.0, "backward": 2.0}, {"forward": 9.0, "backward": 2.0}, {"forward": 2.0, "backward": 3.0}]
    out = prof.summarise(steps, steps, [10, 10, 10])
    assert out["phase_s"]["forward"] == 2.0 and out["phase_s"]["backward"] == 2.0
    assert out["step_s"] == 5.0 and out["step_s_all"] == [3.0, 11.0, 5.0]  # the median step, not a sum of medians
    assert out["tokens_per_s"] == pytest.approx(2.0)


def test_profile_debug_step_on_cpu(tiny_data, tmp_path):
    result = prof.main(["--config", "debug_pretrain", "--out", str(tmp_path), "--steps", "1", "--warmup", "0",
                        "--module-steps", "1", "--pipeline-steps", "2", f"data.path={tiny_data}", *FAST])
    saved = json.loads((tmp_path / "profile_train_step.json").read_text())
    assert saved["app"]["step_s"] == pytest.approx(result["app"]["step_s"])
    phases = saved["app"]["phase_s"]
    for name in ("data", "forward", "loss", "backward", "optim", "qk_max_mla", "mask_build"):
        assert phases[name] > 0, name
    assert sum(phases[p] for p in prof.PHASES) == pytest.approx(saved["app"]["step_s"])
    assert set(saved["bare"]) == set(prof.BARE_VARIANTS) and all(v["step_s"] > 0 for v in saved["bare"].values())
    assert saved["module_fwd_s"]["fwd/KDALayer"] > 0 and saved["module_fwd_s"]["fwd/MLAttention"] > 0
    ops = saved["ops_per_step"]  # by innermost phase (on a CPU by default)
    assert ops["forward"] > 0 and ops["backward"] > 0 and ops["optim"] > 0
    pipe = saved["pipeline"]  # the app's own loop: queue_step k + 1, then read step k
    assert pipe["steps"] == 2 and pipe["wall_s_per_step"] > 0 and pipe["tokens_per_step"] > 0
    from kimi_vl.modeling import attention, model

    assert attention.MLAttention._track.__name__ == "_track" and model.build_mask.__name__ == "build_mask"  # undone


def test_report_shows_where_the_gpu_waited():
    """The pipeline's ``idle_gaps`` (CUDA only, so given here) in the text report: idle time by host op, by
    annotation, and the largest holes."""
    gaps = {"window_ms": 300.0, "busy_ms": 250.0, "idle_ms": 50.0, "holes": 2, "holes_ms": 45.0,
            "gaps": [{"us": 30000.0, "host": "aten::copy_", "phase": "Optimizer.step#MuonClip.step",
                      "next_kernel": "ns_kernel"}, {"us": 15000.0, "host": "cudaHostAlloc", "phase": "(none)",
                                                     "next_kernel": "nvjet_tst"}],
            "idle_by_host": [("aten::copy_", 30.0), ("cudaHostAlloc", 15.0)],
            "idle_by_phase": [("Optimizer.step#MuonClip.step", 30.0), ("(none)", 15.0)]}
    pipe = {"steps": 2, "wall_s_per_step": 0.3, "tokens_per_s": 1000.0, "device_busy_fraction": 0.83,
            "idle_gaps": gaps, "data_wait_s": [0.002, 0.05],
            "allocator": {"host_allocs": 3.0, "host_alloc_mb": 96.0, "host_alloc_ms": 14.5, "device_allocs": 0.0,
                          "alloc_retries": 1.0},
            "allocator_trace": [(0.0, 0.0, 0.0)] + [(0.3 * (i + 1), 3.0, 96.0) for i in range(11)]}
    text = "\n".join(app_loop.pipeline_lines(pipe))
    assert "app loop, unsynchronised (2 steps): 300.0 ms a step (1000 tok/s); device busy 83%" in text
    assert "GPU idle under the profiler: 50.0 of 300.0 ms, 2 holes >= 20 us (45.0 ms)" in text
    assert "30.00 ms  aten::copy_" in text and "Optimizer.step#MuonClip.step 30.0 ms" in text
    assert "30000 us in aten::copy_ before ns_kernel" in text
    assert "waiting for the loader: 26.0 ms a step on average, 1 of 2 steps waited > 10 ms (max 50 ms)" in text
    assert "3 pinned blocks created (96 MB, 14.5 ms in cudaHostAlloc), 0 device segments, 1 retries" in text
    assert "steps 1-10: 300.0 ms a step, 3 pinned blocks (96 MB)" in text
    assert "steps 11-11: 300.0 ms a step, 0 pinned blocks (0 MB)" in text


def test_a_disabled_phase_timer_does_not_synchronise(monkeypatch):
    """The app-loop measurement disables the timer; its wrapped phases must then leave the device alone (until
    session 13 they synchronised ~40 times a step, so the "unsynchronised" loop was not)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append(1))
    timer = prof.PhaseTimer(torch.device("cpu"))
    timer.cuda = True  # as on a GPU, without one
    timed = timer.wrap("vision_tower", lambda x: x + 1)
    timer.enabled = False
    assert timed(1) == 2 and calls == [] and timer.totals == {}
    timer.enabled = True
    assert timed(1) == 2 and len(calls) == 2 and "vision_tower" in timer.totals
