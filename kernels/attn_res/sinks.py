"""Gradient sinks of the AttnRes mix kernels: a source that several mixes read (a completed block state) gets its
gradient accumulated in place in one buffer (``mix_triton.py``'s backward kernels add into it) instead of autograd's
sum of one gradient tensor per mix."""

from __future__ import annotations

import torch


class GradSink:
    """The gradient of one source that several mixes read (a completed block state), accumulated in place.

    Autograd would take one ``dx`` tensor from every mix that reads the source and add them (write ``dx``, then
    read two and write one per extra mix). With a sink, the backward kernels add into one buffer instead (read
    and write it once per mix), and only the first mix in forward order, which is the last to run backward
    (every later mix reads a sum that depends on its output), returns the buffer to autograd; the others
    return no gradient for that source. A buffer is tied to the backward pass (autograd graph task) that
    started it, so a pass that skipped the returning mix (gradients of a subset of inputs) leaves nothing behind
    for the next one."""

    __slots__ = ("buf", "task", "uses")

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.task = -1  # the autograd graph task that started ``buf``: a buffer left by another pass is stale
        self.uses = 0


def sink_buffers(sinks: list[GradSink | None], like: torch.Tensor, task: int, skip: int = 0
                 ) -> tuple[list[torch.Tensor], int]:
    """One gradient buffer per sink (``None``: a new tensor): a sink's buffer, started if it has none for this
    backward pass (``task``), and the mask of the ones to add into. Bit ``i`` of ``skip``: entry ``i`` is only a
    placeholder pointer (``like``, never written)."""
    bufs, acc_mask = [], 0
    for i, sink in enumerate(sinks):
        if (skip >> i) & 1:
            bufs.append(like)
        elif sink is None:
            bufs.append(torch.empty_like(like))
        elif sink.buf is None or sink.task != task:
            sink.buf, sink.task = torch.empty_like(like), task
            bufs.append(sink.buf)
        else:
            bufs.append(sink.buf)
            acc_mask |= 1 << i
    return bufs, acc_mask
