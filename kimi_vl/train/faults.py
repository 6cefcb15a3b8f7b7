"""Faults a training run must survive: SIGTERM/SIGINT and non-finite losses.

- :class:`GracefulStop` turns SIGTERM (and SIGINT) into a flag the loop checks after each step, so
  the current step finishes, a checkpoint is written and the process exits cleanly.
- :class:`NonFiniteGuard` remembers the last finite metrics; on a NaN/Inf loss it raises
  :class:`NonFiniteLossError` naming the step and those metrics, and the loop keeps the last good
  checkpoint untouched.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from typing import Any


class NonFiniteLossError(RuntimeError):
    """The loss became NaN/Inf; the message names the step and the last finite metrics."""


class GracefulStop:
    """Context manager that records SIGTERM/SIGINT instead of dying mid-step."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)):
        self.signals = signals
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        self.requested = signal.Signals(signum).name

    def __enter__(self) -> GracefulStop:
        for sig in self.signals:
            try:
                self._previous[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: signals stay with the caller
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class NonFiniteGuard:
    """Keeps the last finite metrics and raises on a non-finite loss."""

    def __init__(self) -> None:
        self.last_finite: dict[str, Any] = {}
        self.last_finite_step: int | None = None

    def check(self, step: int, loss: float, metrics: Mapping[str, Any]) -> None:
        if math.isfinite(loss):
            self.last_finite = dict(metrics)
            self.last_finite_step = step
            return
        shown = {k: v for k, v in self.last_finite.items() if isinstance(v, (int, float))}
        raise NonFiniteLossError(
            f"loss became {loss} at step {step}; last finite metrics (step {self.last_finite_step}): {shown}. "
            "The last good checkpoint is kept; lower the learning rate or check the data, then resume."
        )
