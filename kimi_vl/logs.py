"""Output every stage shares: rank-0 printing, JSON-lines metrics, progress bars, trackers.

- :func:`print0` prints on the main process only (``RANK``/``LOCAL_RANK`` unset or 0).
- :class:`MetricsWriter` appends one JSON object per step to ``metrics.jsonl`` and optionally
  forwards the same scalars to TensorBoard through accelerate's trackers.
- :func:`progress` is tqdm that switches itself off when stdout is not a terminal, under CI
  (``CI`` set), on non-zero ranks, or when ``KVL_PROGRESS=0``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm


def rank() -> int:
    """The global rank from the launcher's environment (0 when not distributed)."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def is_rank0() -> bool:
    return rank() == 0


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` on rank 0 only, flushed."""
    if is_rank0():
        print(*args, **kwargs, flush=True)


def progress_enabled() -> bool:
    if os.environ.get("KVL_PROGRESS") is not None:
        return os.environ["KVL_PROGRESS"] not in ("0", "false", "")
    return is_rank0() and not os.environ.get("CI") and sys.stderr.isatty()


def progress(iterable: Iterable | None = None, **kwargs: Any) -> tqdm:
    """A tqdm bar that is off when nobody is watching (see module docstring)."""
    kwargs.setdefault("disable", not progress_enabled())
    kwargs.setdefault("dynamic_ncols", True)
    kwargs.setdefault("leave", False)
    return tqdm(iterable, **kwargs)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class MetricsWriter:
    """Appends ``{"step": s, "time": t, ...}`` lines to ``<out_dir>/metrics.jsonl`` on rank 0.

    ``trackers`` is an optional accelerate ``Accelerator`` whose ``log`` receives the scalar values
    (TensorBoard when the run config asks for it).
    """

    def __init__(self, out_dir: str | os.PathLike, filename: str = "metrics.jsonl", accelerator: Any = None):
        self.path = Path(out_dir) / filename
        self.accelerator = accelerator
        self.enabled = is_rank0()
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict:
        record = {"step": int(step), "time": round(time.time(), 3), **_jsonable(dict(metrics))}
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        if self.accelerator is not None:
            scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
            self.accelerator.log(scalars, step=step)
        return record


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a ``metrics.jsonl`` file (an unfinished last line is ignored)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
