"""Helpers shared by the AttnRes benchmarks (``bench_attnres.py`` and its decode half ``attnres_decode.py``)."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from kernels.profiling import time_by_name


def restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def with_env(env: dict[str, str], fn: Callable[[], float]):
    """``fn()`` with the environment variables ``env`` set (and restored afterwards)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return fn()
    finally:
        for k, v in old.items():
            restore_env(k, v)


def profile_step(step: Callable[[], None]) -> dict[str, tuple[float, int]]:
    """One (warm) step under ``torch.profiler``: time and calls per GPU kernel (per ``aten::`` op on a CPU)."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return time_by_name(prof)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def sleep_cycles_per_ms(device: torch.device) -> float:
    """GPU clock cycles of ``torch.cuda._sleep`` per millisecond, measured with events."""
    cycles = 20_000_000
    torch.cuda._sleep(cycles // 10)  # warm the kernel up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize(device)
    return cycles / start.elapsed_time(end)
