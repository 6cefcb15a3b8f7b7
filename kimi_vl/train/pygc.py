"""Python's garbage collector on a schedule during training (``TrainConfig.gc_every``), and its cost measured.

Left automatic, a full (generation-2) collection starts whenever enough container objects survive, in the middle
of some step, and walks every object the process holds (modules, tokenizer, loader state). With ``gc_every = N > 0``
the objects built before training are frozen (``gc.freeze``: never scanned again), automatic collection is off,
and one full collection runs after every N-th step. ``gc_every = 0`` keeps Python's automatic collection.

Either way the seconds spent in full collections during a step (automatic or scheduled) are measured through
``gc.callbacks`` and logged as that step's ``gc_s`` (absent when none ran), so a slow step can be checked against
the collector. Leaving the context restores the collector as it was.
"""

from __future__ import annotations

import gc
import time


class ScheduledGC:
    """``with ScheduledGC(every) as pygc:`` around the training loop; ``pygc.after_step(step)`` after each step."""

    def __init__(self, every: int) -> None:
        if every < 0:
            raise ValueError(f"gc_every must be >= 0 (0: Python's automatic collection), got {every}")
        self.every = every
        self._was_enabled = gc.isenabled()
        self._started: float | None = None
        self._full_s = 0.0
        self._full_n = 0

    def _on_gc(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._full_s += time.perf_counter() - self._started
            self._full_n += 1
            self._started = None

    def __enter__(self) -> ScheduledGC:
        self._was_enabled = gc.isenabled()
        if self.every:
            gc.collect()
            gc.freeze()
            gc.disable()
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self.every:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()

    def after_step(self, step: int) -> float | None:
        """Runs the scheduled collection when ``step`` is due; returns the seconds spent in full collections since
        the previous call (the scheduled one and any automatic ones), or None when there were none."""
        if self.every and step % self.every == 0:
            gc.collect()
        if not self._full_n:
            return None
        spent, self._full_s, self._full_n = self._full_s, 0.0, 0
        return spent
