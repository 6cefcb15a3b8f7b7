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
