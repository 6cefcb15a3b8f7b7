"""Calling a Triton kernel's compiled variant directly, without the JIT's per-call work.

``kernel[grid](...)`` binds and specialises every argument, builds a cache key and checks globals on every call:
29.6 us of host time a launch on the H100 machine (session 12, ``bench_attnres --stream-cost``) against 7.2 us
for a ``torch.add``. :class:`CompiledLaunch` sends a call's first launch for a specialisation through the JIT
(compiling if need be), keeps the compiled kernel's runner, and later calls the runner with the current stream.

The caller's ``key`` must fix everything the JIT specialises on that can change between calls: pointer
alignment (16 bytes), dtypes, the values of ints that are not ``do_not_specialize``, constexpr values, and the
launch options (``num_warps``, ``maxnreg``, ...) where they can change. ``values`` are every parameter in
signature order, constexprs included. Under ``TRITON_INTERPRET=1`` (no compiled kernels)
and with ``KVL_FAST_LAUNCH=0`` every call takes the JIT.

Tried and removed (session 31, H200, Triton 3.6): the same for every kernel of the model, with the key built from
the arguments in Python (dtype and alignment of each tensor, each int's specialisation, constexpr values). The
step's host time went up, not down (``step_timeline``: forward 21.2 against 17.9 ms standard, 26.8 against 23.0
block AttnRes), and the device-bound and timed steps did not change (``bench_backbone`` 31.9 / 32.3% MFU against
31.8 / 32.3%): Triton 3.6's own launch path is about as fast as a key built in Python. Only kernels whose key the
caller knows cheaply use this class.
"""

from __future__ import annotations

import os

import torch
from triton.runtime import driver

__all__ = ["CompiledLaunch", "aligned16", "fast_launch_enabled"]


def fast_launch_enabled() -> bool:
    """``KVL_FAST_LAUNCH`` (``1`` default | ``0``), and not under the Triton interpreter."""
    flag = os.environ.get("KVL_FAST_LAUNCH") or "1"
    if flag not in ("0", "1"):
        raise ValueError(f"kernels/fast_launch.py: KVL_FAST_LAUNCH must be 0 or 1, got {flag!r}")
    return flag == "1" and os.environ.get("TRITON_INTERPRET") != "1"


def aligned16(*tensors: torch.Tensor) -> bool:
    """Every tensor's address a multiple of 16 bytes (what the JIT specialises pointer arguments on)."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


class CompiledLaunch:
    """One kernel's launches: ``launch(grid, key, *values, **options)``, ``options`` the JIT's launch options
    (``num_warps``, ``maxnreg``, ...; part of ``key`` where they can change). Runners are kept per device, grid and
    key."""

    __slots__ = ("kernel", "runners")

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.runners: dict = {}

    def __call__(self, grid: tuple[int, ...], key: tuple, *values, **options) -> None:
        fast = fast_launch_enabled()
        if fast:
            device = driver.active.get_current_device()
            full_key = (device, grid, key)
            runner = self.runners.get(full_key)
            if runner is not None:
                runner(*values, stream=driver.active.get_current_stream(device))
                return
        compiled = self.kernel[grid](*values, **options)
        if fast and hasattr(compiled, "packed_metadata"):  # the runner reads three grid dimensions
            self.runners[full_key] = compiled[(*grid, *(1,) * (3 - len(grid)))]
