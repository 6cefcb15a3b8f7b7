"""Python's garbage collector on a schedule during training (``TrainConfig.gc_every``).

Left automatic, a full (generation-2) collection starts whenever enough container objects survive, in the
middle of some step: it walks every object the process holds (modules, tokenizer, loader state), and steps of
the GPU app that normally take ~0.2 s took 0.45-0.6 s at seemingly random steps (sessions 8 and 9, H100). With
``gc_every = N > 0`` the objects built before training are frozen (``gc.freeze``: never scanned again), automatic
collection is off, and one full collection runs after every N-th step, timed into that step's metrics as
``gc_s``. Leaving the context restores the collector as it was. ``gc_every = 0`` keeps Python's automatic
collection.
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

    def __enter__(self) -> ScheduledGC:
        if self.every:
            self._was_enabled = gc.isenabled()
            gc.collect()
            gc.freeze()
            gc.disable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.every:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()

    def after_step(self, step: int) -> float | None:
        """Seconds spent in the collection run after ``step``, or None when none ran."""
        if not self.every or step % self.every:
            return None
        t0 = time.perf_counter()
        gc.collect()
        return time.perf_counter() - t0
