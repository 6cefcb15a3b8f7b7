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

:func:`fast` (``fast(kernel)[grid](*args, **kwargs)``, the JIT's own call form) builds that key itself from the
arguments, at least as finely as the JIT specialises: a tensor's dtype and 16-byte alignment, an int's ``== 1``,
divisibility by 16 and 32/64-bit range (only the range for ``do_not_specialize`` ints), a bool's and a constexpr's
value, a float's type. Arguments of any other kind take the JIT. Like :class:`CompiledLaunch` it does not watch
the kernel's global variables (the JIT refuses a changed one anyway).
"""

from __future__ import annotations

import inspect
import os

import torch
from triton.runtime import driver

__all__ = ["CompiledLaunch", "FastKernel", "aligned16", "fast", "fast_launch_enabled"]


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


def _spec(value, constexpr: bool, nospec: bool):
    """What the JIT may specialise ``value`` on (see the module docstring); ``_OTHER`` for a kind it does not know."""
    if constexpr:
        return value
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        wide = not -2**31 <= value < 2**31
        return ("i", wide) if nospec else ("i", value == 1, value % 16 == 0, wide)
    if isinstance(value, float):
        return "f"
    if value is None:
        return None
    return _OTHER


_OTHER = object()


class FastKernel:
    """``FastKernel(kernel)[grid](*args, **kwargs)``: the JIT's call with its key built by :func:`_spec` (use
    :func:`fast`). ``grid``: a tuple (a callable grid takes the JIT)."""

    __slots__ = ("kernel", "launch", "names", "flags", "defaults", "index")

    def __init__(self, kernel) -> None:
        self.kernel, self.launch = kernel, CompiledLaunch(kernel)
        params = kernel.params
        self.names = [p.name for p in params]
        self.flags = [(bool(p.is_constexpr), bool(p.do_not_specialize)) for p in params]
        self.defaults = [p.default for p in params]
        self.index = {name: i for i, name in enumerate(self.names)}

    def __getitem__(self, grid):
        if callable(grid) or not fast_launch_enabled():
            return self.kernel[grid]
        return lambda *args, **kwargs: self._run(grid, args, kwargs)

    def _run(self, grid: tuple, args: tuple, kwargs: dict) -> None:
        values = list(args) + [_MISSING] * (len(self.names) - len(args))
        options = {}
        for name, value in kwargs.items():
            i = self.index.get(name)
            if i is None:
                options[name] = value
            else:
                values[i] = value
        for i, value in enumerate(values):
            if value is _MISSING:
                default = self.defaults[i]
                if default is inspect.Parameter.empty:
                    raise TypeError(f"kernels/fast_launch.py: {self.kernel.__name__} is missing argument "
                                    f"{self.names[i]!r}")
                values[i] = default
        key = tuple(_spec(v, c, n) for v, (c, n) in zip(values, self.flags))
        if any(k is _OTHER for k in key):
            self.kernel[grid](*values, **options)
            return
        self.launch(tuple(grid), (key, tuple(sorted(options.items()))), *values, **options)


_MISSING = object()
_FAST: dict = {}


def fast(kernel):
    """The :class:`FastKernel` of a ``triton.jit`` kernel (one per kernel); the kernel itself under the interpreter,
    with ``KVL_FAST_LAUNCH=0`` and for an object without the JIT's parameter list (an autotuner, say)."""
    if not fast_launch_enabled() or not hasattr(kernel, "params"):
        return kernel
    launcher = _FAST.get(kernel)
    if launcher is None:
        launcher = _FAST[kernel] = FastKernel(kernel)
    return launcher
