"""``kimi_vl.benchmarks.step_timeline`` on the CPU: its bookkeeping (per-step host and GPU times, the GPU's lag
behind the host, the idle time between kernels after the sleep kernel, variant specs) and a smoke run of the script
(the timings themselves are GPU-only)."""

from __future__ import annotations

import json

import pytest

from kimi_vl.benchmarks import step_timeline as st


def test_summarize_round_gives_per_step_times_and_lags():
    """Two steps after a 10 ms sleep: host and GPU time of each phase, the GPU's lag at each mark, the step time on
    the GPU's clock from the end of the sleep."""
    marks = [("base", 0.0, 0.0), ("awake", 0.1, 10.0),
             ("start", 0.2, 10.1), ("layer0", 1.0, 11.0), ("forward", 5.0, 20.0), ("backward", 8.0, 40.0),
             ("start", 8.5, 40.1), ("layer0", 9.0, 41.0), ("forward", 13.0, 50.0), ("backward", 16.0, 70.0)]
    out = st.summarize_round(marks, steps=2)
    assert out["step_ms"] == pytest.approx((70.0 - 10.0) / 2)
    first, second = out["steps"]
    assert first["host_fwd_ms"] == pytest.approx(4.8) and first["host_bwd_ms"] == pytest.approx(3.0)
    assert first["gpu_fwd_ms"] == pytest.approx(9.9) and first["gpu_bwd_ms"] == pytest.approx(20.0)
    assert second["lag_ms"]["layer0"] == pytest.approx(32.0) and second["lag_ms"]["backward"] == pytest.approx(54.0)


def test_summarize_round_leaves_out_the_pauses_between_steps():
    """``--between-ms``: a sleep kernel between two steps (marks ``pause`` / ``resume``) is not in the step time."""
    marks = [("base", 0.0, 0.0), ("awake", 0.1, 10.0),
             ("start", 0.2, 10.1), ("forward", 5.0, 20.0), ("backward", 8.0, 40.0),
             ("pause", 8.1, 40.0), ("resume", 8.2, 55.0),
             ("start", 8.5, 55.1), ("forward", 13.0, 65.0), ("backward", 16.0, 85.0)]
    out = st.summarize_round(marks, steps=2)
    assert out["step_ms"] == pytest.approx((85.0 - 10.0 - 15.0) / 2)
    assert out["steps"][1]["gpu_fwd_ms"] == pytest.approx(9.9)


def test_summarize_round_on_the_host_clock_alone():
    marks = [("base", 0.0, None), ("awake", 0.0, None), ("start", 0.0, None), ("forward", 3.0, None),
             ("backward", 7.0, None)]
    out = st.summarize_round(marks, steps=1)
    assert out["step_ms"] == pytest.approx(7.0)
    assert out["steps"] == [{"host_fwd_ms": 3.0, "host_bwd_ms": 4.0}]


def test_gaps_after_sleep_count_only_the_step():
    """Kernels before and including the sleep are left out; overlapping kernels (two streams) are merged; each wait is
    put on the kernel that ended it."""
    spans = [(0, 5, "warm"), (10, 1000, "spin_kernel"), (1001, 1011, "a"), (1013, 1020, "b"), (1015, 1030, "c"),
             (1034, 1040, "a")]
    out = st.gaps_after_sleep(spans, top=5)
    assert out["kernels"] == 4 and out["window_ms"] == pytest.approx(0.039)
    assert out["busy_ms"] == pytest.approx(0.033) and out["idle_ms"] == pytest.approx(0.006)
    assert out["waits"] == 2
    assert out["by_next_kernel"][0] == {"next_kernel": "a", "idle_ms": pytest.approx(0.004), "waits": 1,
                                        "mean_us": pytest.approx(4.0)}


def test_parse_variant():
    assert st.parse_variant("attnres_block:KVL_FAST_LAUNCH=0,KVL_X=1") == (
        "attnres_block:KVL_FAST_LAUNCH=0,KVL_X=1", "attnres_block", {"KVL_FAST_LAUNCH": "0", "KVL_X": "1"})
    with pytest.raises(ValueError, match="residual mode"):
        st.parse_variant("prenorm")
    with pytest.raises(ValueError, match="ENV=VALUE"):
        st.parse_variant("standard:KVL_FAST_LAUNCH")


def test_smoke_run_writes_its_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    st.main(["--smoke", "--cprofile", "3"])
    out = json.loads((tmp_path / "step_timeline.json").read_text())
    assert set(out["variants"]) == {"standard", "attnres_block"}
    for row in out["variants"].values():
        assert row["step_ms"] > 0 and row["host_fwd_ms"] > 0 and "head_start_ms" not in row
    assert len(out["cprofile"]["standard"]) == 3
    assert "| attnres_block |" in capsys.readouterr().out
