"""GPU kernel events of a ``torch.profiler`` run, for the benchmarks that compare a step's wall time with the GPU
work in it. User annotations (``Optimizer.step#...``, ``record_function`` ranges) are also CUDA-side events in
the profiler's list; they span kernels already counted and are left out."""

from __future__ import annotations

from typing import Any

import torch


def kernel_events(prof: Any) -> list[Any]:
    """The kernel (and memcpy/memset) events of a finished ``torch.profiler.profile``, without user annotations."""
    return [e for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]


def kernel_ms(prof: Any) -> float:
    """Summed GPU time of :func:`kernel_events`, in ms."""
    return sum(e.device_time_total for e in kernel_events(prof)) / 1000


def time_by_name(prof: Any) -> dict[str, tuple[float, int]]:
    """``name -> (ms, calls)`` of a finished ``torch.profiler.profile``: the GPU kernels (:func:`kernel_events`)
    when it recorded any, else (a CPU run) the ``aten::`` operators' self CPU time."""
    events = kernel_events(prof)
    if events:
        pairs = [(e.name, e.device_time_total) for e in events]
    else:
        pairs = [(e.name, e.self_cpu_time_total) for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("aten::")]
    out: dict[str, tuple[float, int]] = {}
    for name, us in pairs:
        ms, calls = out.get(name, (0.0, 0))
        out[name] = (ms + us / 1000, calls + 1)
    return out


def diff_by_name(base: dict[str, tuple[float, int]], other: dict[str, tuple[float, int]],
                 top: int = 20) -> list[dict[str, Any]]:
    """A ``(total)`` row, then the ``top`` names whose time differs most between two :func:`time_by_name` results
    (largest ``|other - base|`` first; a name missing on one side counts 0 there)."""
    rows = []
    for name in base.keys() | other.keys():
        (b_ms, b_n), (o_ms, o_n) = base.get(name, (0.0, 0)), other.get(name, (0.0, 0))
        rows.append({"name": name, "base_ms": b_ms, "other_ms": o_ms, "diff_ms": o_ms - b_ms,
                     "base_calls": b_n, "other_calls": o_n})
    rows.sort(key=lambda r: -abs(r["diff_ms"]))
    total = {"name": "(total)", "base_ms": sum(v[0] for v in base.values()),
             "other_ms": sum(v[0] for v in other.values()), "base_calls": sum(v[1] for v in base.values()),
             "other_calls": sum(v[1] for v in other.values())}
    total["diff_ms"] = total["other_ms"] - total["base_ms"]
    return [total] + rows[:top]
