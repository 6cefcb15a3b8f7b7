"""``NAME=VALUE`` overrides of a kernel module's tuning constants, shared by the benchmark scripts' ``--set`` options
(``ptxas_regs.py``, ``kimi_vl/benchmarks/bench_attnres.py``)."""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator
from types import ModuleType


def set_constants(module: ModuleType, pairs: list[str], where: str) -> dict:
    """Set each ``NAME=VALUE`` of ``pairs`` (VALUE a Python literal) on ``module`` and return them as a dict. NAME
    must be an upper-case constant the module has; otherwise, or for a VALUE that is not a literal, exit with a
    message naming ``where``, the pair and the module."""
    out = {}
    for pair in pairs:
        name, _, value = (x.strip() for x in pair.partition("="))
        if not name.isupper() or not hasattr(module, name):
            raise SystemExit(f"{where}: --set {pair!r}: {module.__name__} has no constant {name!r}")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise SystemExit(f"{where}: --set {pair!r}: {value!r} is not a Python literal") from None
        setattr(module, name, out[name])
    return out


@contextlib.contextmanager
def overridden(settings: list[tuple[ModuleType, str, object]]) -> Iterator[None]:
    """Set each ``(module, NAME, value)`` for the ``with`` block, then restore the old values (also on an error)."""
    saved = [(m, name, getattr(m, name)) for m, name, _ in settings]
    try:
        for m, name, value in settings:
            setattr(m, name, value)
        yield
    finally:
        for m, name, value in reversed(saved):
            setattr(m, name, value)
