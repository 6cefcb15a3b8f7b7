"""GPU kernel events of a ``torch.profiler`` run, for the benchmarks that compare a step's wall time with the GPU
work in it. User annotations (``Optimizer.step#...``, ``record_function`` ranges) are also CUDA-side events in
the profiler's list; they span kernels already counted and are left out."""

from __future__ import annotations

from collections.abc import Callable
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


def idle_gaps(prof: Any, min_us: float = 20.0, top: int = 15) -> dict[str, Any]:
    """Where a profiled run's GPU waited: the holes between its kernels (all streams merged) of at least ``min_us``,
    each with what the host was doing meanwhile. ``prof``: a finished ``torch.profiler.profile`` or its events.

    For a hole, every host thread's innermost event covering the hole's midpoint is found (events of a thread nest),
    and the one that started last is taken as what the GPU waited for (``host``), with the outermost annotation
    around it (``phase``; ``record_function`` ranges, e.g. ``Optimizer.step#...``) and the kernel that ended the
    wait (``next_kernel``). Returns the window from the first kernel's start to the last one's end, the busy and
    idle time in it (ms), the ``top`` largest holes and the idle time summed by ``host`` and by ``phase``."""
    events = list(prof.events()) if hasattr(prof, "events") else list(prof)
    kernels = [(e.time_range.start, e.time_range.end, e.name) for e in events
               if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
    if not kernels:
        return {"window_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0, "gaps": [], "idle_by_host": [], "idle_by_phase": []}
    holes, busy, window = gpu_holes(kernels, min_us)
    blamed = _blame_host(events, holes)
    by_host: dict[str, float] = {}
    by_phase: dict[str, float] = {}
    for (a, b, _), (host, phase) in zip(holes, blamed):
        by_host[host] = by_host.get(host, 0.0) + (b - a) / 1000
        by_phase[phase] = by_phase.get(phase, 0.0) + (b - a) / 1000
    gaps = sorted(({"us": b - a, "host": host, "phase": phase, "next_kernel": name}
                   for (a, b, name), (host, phase) in zip(holes, blamed)), key=lambda g: -g["us"])
    return {"window_ms": window / 1000, "busy_ms": busy / 1000, "idle_ms": (window - busy) / 1000,
            "holes": len(holes), "holes_ms": sum(b - a for a, b, _ in holes) / 1000, "gaps": gaps[:top],
            "idle_by_host": sorted(by_host.items(), key=lambda kv: -kv[1])[:top],
            "idle_by_phase": sorted(by_phase.items(), key=lambda kv: -kv[1])[:top]}


def gpu_holes(spans: list[tuple[float, float, str]], min_us: float) -> tuple[list[tuple[float, float, str]], float, float]:
    """The idle stretches between device ``(start, end, name)`` spans (any order, all streams merged) of at least
    ``min_us``, as ``(start, end, name of the span that ended it)`` in time order; with the busy time and the
    window from the first start to the last end (same units as the spans)."""
    spans = sorted(spans)
    if not spans:
        return [], 0.0, 0.0
    holes, busy, (start, end, _) = [], 0.0, spans[0]
    for s, e, name in spans[1:]:
        if s > end:
            busy += end - start
            if s - end >= min_us:
                holes.append((end, s, name))
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    return holes, busy, end - spans[0][0]


def _blame_host(events: list[Any], holes: list[tuple[float, float, str]]) -> list[tuple[str, str]]:
    """``(host, phase)`` per hole (in order of start, as :func:`idle_gaps` makes them): one sweep over each host
    thread's events sorted by start, keeping the stack of those still open at the hole's midpoint."""
    threads: dict[Any, list[Any]] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU:
            threads.setdefault(e.thread, []).append(e)
    covering: list[list[tuple[Any, Any]]] = [[] for _ in holes]  # per hole: (innermost, outermost annotation)
    for evs in threads.values():
        evs.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
        stack: list[Any] = []
        i = 0
        for h, (a, b, _) in enumerate(holes):
            mid = (a + b) / 2
            while i < len(evs) and evs[i].time_range.start <= mid:
                while stack and stack[-1].time_range.end < evs[i].time_range.start:
                    stack.pop()
                stack.append(evs[i])
                i += 1
            while stack and stack[-1].time_range.end < mid:
                stack.pop()
            live = [e for e in stack if e.time_range.end >= mid]
            if live:
                phase = next((e for e in live if getattr(e, "is_user_annotation", False)), None)
                covering[h].append((live[-1], phase))
    out = []
    for found in covering:
        if not found:
            out.append(("(no host event)", "(none)"))
            continue
        inner, phase = max(found, key=lambda f: f[0].time_range.start)
        out.append((inner.name, phase.name if phase is not None else "(none)"))
    return out


def sync_sites(fn: Callable[[], object]) -> dict[str, int]:
    """Call sites (``package/file.py:line``) of the host-device synchronisations while ``fn`` runs
    (``torch.cuda.set_sync_debug_mode``), most frequent first, at most 30. A site is the innermost frame outside
    torch's package (a sync inside a torch function, e.g. ``torch.cuda.synchronize``, is named by its caller: the
    warning itself points into torch). Warnings while the mode is switched are left out: the one "synchronisation a
    step" that sessions 28-29 recorded (``cuda/__init__.py:1270``, then this file's call of ``fn``) was that;
    ``scripts/find_sync.py`` (the mode set to raise) found none in the small hybrid's step (session 29 call7)."""
    import traceback
    import warnings

    sites: dict[str, int] = {}
    running = False  # warnings while the mode is switched are not fn's (switching warned once a call, session 29)

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        if running and "synchroniz" in str(message):
            key = _site(traceback.extract_stack()[:-1], filename, lineno)
            sites[key] = sites.get(key, 0) + 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        running = True
        try:
            fn()
        finally:
            running = False
            torch.cuda.set_sync_debug_mode("default")
    return dict(sorted(sites.items(), key=lambda kv: -kv[1])[:30])


def _site(stack: list, filename: str, lineno: int) -> str:
    """``package/file.py:line`` of the innermost frame of ``stack`` outside torch and the warnings machinery, else
    of ``filename:lineno``."""
    from pathlib import Path

    torch_dir = str(Path(torch.__file__).parent)
    for frame in reversed(stack):
        if not frame.filename.startswith(torch_dir) and "warnings" not in Path(frame.filename).name:
            filename, lineno = frame.filename, frame.lineno
            break
    return f"{'/'.join(Path(filename).parts[-2:])}:{lineno}"
