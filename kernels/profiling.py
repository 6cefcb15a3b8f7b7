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
