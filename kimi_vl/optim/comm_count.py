"""Counting what collectives move, per rank: the measure behind "Muon communicates <= 1.25x distributed AdamW".

Source: REFERENCE.md section 4 ("Communication ~1-1.25x of distributed AdamW"); bus-byte convention of
NCCL's performance notes (the bytes one rank sends on a ring, which is also what it receives).

:class:`CommCounter` wraps the ``torch.distributed`` collectives while it is active and records every call
with real tensors (counted, not estimated from model sizes). DDP's gradient all-reduce runs in C++ and is
invisible to Python, so :meth:`CommCounter.ddp_hook` is a DDP comm hook (plain averaging all-reduce through
the wrapped ``dist.all_reduce``) that makes it counted the same way. FSDP2 calls the Python collectives.

Per call, with world size ``w`` and ``n`` the bytes named below:

    all_reduce (n = tensor)                     bus = 2 (w-1)/w n
    all_gather[_into_tensor|_single] (n = out)  bus = (w-1)/w n
    reduce_scatter[_tensor|_single] (n = in)    bus = (w-1)/w n
    all_to_all_single (n = input)               bus = input bytes addressed to other ranks
    broadcast (n = tensor)                      bus = (w-1)/w n
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class CommRecord:
    """One collective call: its name, the payload bytes it was called with and this rank's bus bytes."""

    op: str
    payload_bytes: int
    bus_bytes: float


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _world(group: Any) -> int:
    return dist.get_world_size(group)


def _bus(name: str, args: tuple, kwargs: dict[str, Any]) -> tuple[int, float]:
    """(payload bytes, bus bytes) of one call of the collective ``name``."""
    group = kwargs.get("group")
    if name == "all_reduce":
        n = _nbytes(args[0] if args else kwargs["tensor"])
        w = _world(group)
        return n, 2 * (w - 1) / w * n
    if name == "broadcast":
        n = _nbytes(args[0] if args else kwargs["tensor"])
        w = _world(group)
        return n, (w - 1) / w * n
    if name == "all_gather":
        outs = args[0] if args else kwargs["tensor_list"]
        n = sum(_nbytes(t) for t in outs)
        w = _world(group)
        return n, (w - 1) / w * n
    if name in ("all_gather_into_tensor", "all_gather_single"):
        n = _nbytes(args[0] if args else kwargs["output_tensor"])
        w = _world(group)
        return n, (w - 1) / w * n
    if name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        n = _nbytes(args[1] if len(args) > 1 else kwargs["input"])
        w = _world(group)
        return n, (w - 1) / w * n
    if name == "all_to_all_single":
        inp = args[1] if len(args) > 1 else kwargs["input"]
        splits = args[3] if len(args) > 3 else kwargs.get("input_split_sizes")
        w, rank = _world(group), dist.get_rank(group)
        n = _nbytes(inp)
        row = n // max(inp.shape[0], 1) if inp.dim() else n
        own = splits[rank] * row if splits else n // w
        return n, float(n - own)
    raise ValueError(f"kimi_vl/optim/comm_count.py: no byte rule for collective {name!r}")


COUNTED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single",
           "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all_single")


class CommCounter:
    """Context manager recording every wrapped collective on this rank (see the module docstring)."""

    def __init__(self) -> None:
        self.records: list[CommRecord] = []
        self._saved: dict[str, Callable] = {}
        self.active = False

    def _wrap(self, name: str, fn: Callable) -> Callable:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                payload, bus = _bus(name, args, kwargs)
                self.records.append(CommRecord(name, payload, bus))
            return fn(*args, **kwargs)

        return counted

    def __enter__(self) -> CommCounter:
        for name in COUNTED:
            fn = getattr(dist, name, None)
            if fn is not None:
                self._saved[name] = fn
                setattr(dist, name, self._wrap(name, fn))
        self.active = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.active = False
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved.clear()

    def reset(self) -> None:
        self.records.clear()

    def summary(self) -> dict[str, Any]:
        """Totals and per-op totals of calls, payload bytes and bus bytes since the last reset."""
        by_op: dict[str, dict[str, float]] = {}
        for r in self.records:
            d = by_op.setdefault(r.op, {"calls": 0, "payload_bytes": 0, "bus_bytes": 0.0})
            d["calls"] += 1
            d["payload_bytes"] += r.payload_bytes
            d["bus_bytes"] += r.bus_bytes
        return {"calls": len(self.records), "payload_bytes": sum(r.payload_bytes for r in self.records),
                "bus_bytes": sum(r.bus_bytes for r in self.records), "by_op": by_op}

    @staticmethod
    def ddp_hook(state, bucket):  # noqa: ANN001, ANN205 - DDP rejects string annotations (postponed evaluation)
        """DDP comm hook: average the bucket with ``dist.all_reduce`` (counted while a counter is active).

        ``state`` is the process group (or None), ``bucket`` a ``dist.GradBucket``; returns a
        ``torch.futures.Future`` of the averaged bucket. Register with
        ``ddp.register_comm_hook(process_group_or_None, CommCounter.ddp_hook)``.
        """
        buf = bucket.buffer()
        buf.div_(dist.get_world_size(state))
        work = dist.all_reduce(buf, group=state, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])
