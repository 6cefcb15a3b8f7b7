"""``kernels/profiling.py``: per-name times of a profiled run and their difference between two runs (on a CPU the
``aten::`` operators stand in for GPU kernels)."""

from __future__ import annotations

import pytest
import torch

from kernels.profiling import diff_by_name, time_by_name


def _profile(fn) -> dict[str, tuple[float, int]]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return time_by_name(prof)


def test_time_by_name_counts_calls_and_diff_ranks_the_extra_work():
    x = torch.randn(512, 512)
    _profile(lambda: x @ x)  # the first profiled matmul pays one-off costs (thread pool, profiler start) and could
    # come out slower than three warm ones
    base = _profile(lambda: x @ x)
    other = _profile(lambda: [x @ x for _ in range(3)] + [torch.cumsum(x, 0) for _ in range(2)])
    assert base["aten::mm"][1] == 1 and other["aten::mm"][1] == 3
    assert "aten::cumsum" not in base and other["aten::cumsum"][1] == 2
    rows = diff_by_name(base, other, top=50)
    total, named = rows[0], {r["name"]: r for r in rows[1:]}
    assert total["name"] == "(total)"
    assert total["other_calls"] == sum(n for _, n in other.values())
    assert abs(total["diff_ms"] - (total["other_ms"] - total["base_ms"])) < 1e-9
    assert named["aten::cumsum"]["base_calls"] == 0 and named["aten::cumsum"]["other_calls"] == 2
    assert named["aten::mm"]["diff_ms"] > 0
    diffs = [abs(r["diff_ms"]) for r in rows[1:]]
    assert diffs == sorted(diffs, reverse=True)
    assert len(diff_by_name(base, other, top=1)) == 2


def _event(i: int, name: str, start: float, end: float, cuda: bool = False, annotation: bool = False,
           thread: int = 1):
    from torch.autograd.profiler_util import FunctionEvent

    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    return FunctionEvent(i, name, thread, start, end, device_type=kind, is_user_annotation=annotation)


def test_idle_gaps_names_what_the_host_did_while_the_gpu_waited():
    """Kernels 50-150, 160-300, 650-800 and 900-950 us (one overlapping annotation on the GPU side, not a
    kernel): holes of 350 us (the host in a training step, nothing inner open) and 100 us (in the optimizer's
    ``muon``, whose ``aten::add`` had ended); the 10 us hole is below ``min_us`` but idle all the same. A second
    host thread (the autograd engine's) that is inside ``aten::mm`` at the first hole's midpoint started later than
    the step, so the first hole is blamed on it."""
    from kernels.profiling import idle_gaps

    events = [
        _event(1, "step", 0, 1000, annotation=True), _event(2, "aten::mm", 100, 200), _event(3, "muon", 500, 900),
        _event(4, "aten::add", 600, 700), _event(5, "aten::mm", 400, 560, thread=2),
        _event(10, "k1", 50, 150, cuda=True), _event(11, "k2", 160, 300, cuda=True),
        _event(12, "k3", 650, 800, cuda=True), _event(13, "k4", 900, 950, cuda=True),
        _event(14, "step", 0, 960, cuda=True, annotation=True),
    ]
    out = idle_gaps(events, min_us=20)
    assert out["window_ms"] == pytest.approx(0.9) and out["busy_ms"] == pytest.approx(0.44)
    assert out["idle_ms"] == pytest.approx(0.46) and out["holes"] == 2 and out["holes_ms"] == pytest.approx(0.45)
    first, second = out["gaps"]
    assert first == {"us": 350, "host": "aten::mm", "phase": "(none)", "next_kernel": "k3"}
    assert second == {"us": 100, "host": "muon", "phase": "step", "next_kernel": "k4"}
    assert dict(out["idle_by_host"]) == pytest.approx({"aten::mm": 0.35, "muon": 0.1})
    assert idle_gaps([_event(1, "step", 0, 10)])["gaps"] == []


def test_sync_sites_name_the_caller_outside_torch(monkeypatch):
    """A synchronisation warned from inside torch (here a stand-in warning attributed to torch's own file) is named
    by the innermost frame outside torch: the line of this file that called into it."""
    import warnings
    from pathlib import Path

    from kernels import profiling

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)

    def torch_side():
        warnings.warn_explicit("called a synchronizing CUDA operation", UserWarning, torch.__file__, 7)

    def step():
        torch_side()
        warnings.warn("unrelated", stacklevel=1)

    sites = profiling.sync_sites(step)
    ((site, count),) = sites.items()
    assert count == 1 and site.startswith(f"{Path(__file__).parent.name}/{Path(__file__).name}:")


def test_sync_sites_ignore_warnings_of_the_mode_switch(monkeypatch):
    """A warning that switching the debug mode itself emits is not counted as the function's synchronisation."""
    import warnings

    from kernels import profiling

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode",
                        lambda mode: warnings.warn("synchronizing debug mode set", UserWarning, stacklevel=1))
    assert profiling.sync_sites(lambda: None) == {}
