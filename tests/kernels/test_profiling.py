"""``kernels/profiling.py``: per-name times of a profiled run and their difference between two runs (on a CPU the
``aten::`` operators stand in for GPU kernels)."""

from __future__ import annotations

import torch

from kernels.profiling import diff_by_name, time_by_name


def _profile(fn) -> dict[str, tuple[float, int]]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return time_by_name(prof)


def test_time_by_name_counts_calls_and_diff_ranks_the_extra_work():
    x = torch.randn(256, 256)
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
