"""Autograd of the fused AttnRes mix (``mix_triton.py`` holds the kernels and their launchers): the mix as a
``torch.autograd.Function``, with in-place gradient accumulation of shared sources (``mix_triton.GradSink``) and
the deferred block-state gradients (:class:`DeferredBlock`)."""

from __future__ import annotations

import torch

from kernels.attn_res.defer_triton import bwd_light, flush_dots
from kernels.attn_res.mix_triton import (
    GradSink,
    _sink_buffers,
    flush_triton,
    mix_bwd_triton,
    mix_fwd_triton,
    use_args,
)


class AttnResMixTriton(torch.autograd.Function):
    """``apply(u [D] fp32, eps, sinks, defer, *sources [M, D]) -> (h [M, D], alpha [N, M] fp32)``, ``u = w * gain``.

    Sources must be contiguous, of one dtype in :data:`DTYPES` and on one device (the public wrapper
    ``kernels.attn_res.attn_res_mix`` checks, casts and flattens). ``u`` is differentiable: its product with the
    weight and gain stays outside (one product for all of a forward's queries in the model's stream), so a mix
    costs no per-call launches for it. ``sinks``: ``None`` or one :class:`GradSink` or ``None`` per source (used
    only on the pointer-argument path). ``defer``: ``None`` or ``(block, flush)``: the gradients of the sources
    with a sink are deferred to ``block`` (a :class:`DeferredBlock`), and the mix with ``flush`` (the block's first
    in forward order, so the last to run backward) forms them for all of the block's mixes at once."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, eps: float, sinks, defer, *sources: torch.Tensor):
        h, rstd, alpha = mix_fwd_triton(list(sources), u, eps)
        ctx.save_for_backward(u, rstd, alpha, *sources)
        ctx.mark_non_differentiable(alpha)
        ctx.set_materialize_grads(False)  # alpha's gradient stays None instead of a zero-filled [N, M] (a launch a mix)
        _claim_sinks(ctx, sinks, len(sources))
        ctx.defer, ctx.defer_mask = None, 0
        if defer is not None and ctx.sinks is not None:
            ctx.defer = defer
            ctx.defer_mask = sum(1 << i for i, sink in enumerate(ctx.sinks) if sink is not None)
        return h, alpha

    @staticmethod
    def backward(ctx, dh: torch.Tensor, _dalpha: torch.Tensor | None):
        u, rstd, alpha, *sources = ctx.saved_tensors
        dh = _as_source(dh, sources[0])  # never None: h is the only differentiable output, so it has a gradient
        dxs, du, coef = mix_bwd_triton(sources, u, dh, rstd, alpha, ctx.sinks, ctx.defer_mask)
        if ctx.defer is not None:
            block, flush = ctx.defer
            task = torch._C._current_graph_task_id()
            block.add(task, dh, u, coef)
            if flush:
                c = ctx.defer_mask.bit_length()  # the deferred sources are the first c (the completed block states)
                flush_deferred(sources[:c], ctx.sinks[:c], block, task)
                dxs[:c] = [sink.buf for sink in ctx.sinks[:c]]
        return du if ctx.needs_input_grad[0] else None, None, None, None, *_source_grads(ctx, dxs, 4)


class DeferredBlock:
    """The deferred source gradients of one AttnRes block's mixes (``KVL_ATTNRES_DEFER_GRAD``).

    Every mix of a block reads the same completed block states. Without deferral each mix's backward adds its
    ``dx`` into each state's :class:`GradSink` buffer (a read and a write of ``[M, D]`` per state and mix). With
    it, a mix's backward stores per token only ``(alpha, k, e)`` of ``dx = alpha dh + k u - e x`` (12 bytes a
    token and state) and keeps its ``dh``; the block's first mix, the last to run backward, then forms every
    state's gradient from all of them in one kernel (:func:`flush_deferred`): per state one read of ``x``, one
    read and write of the buffer, and the ``S`` ``dh`` tiles (read once from memory, again from L2), summed in
    fp32 and rounded once. Entries are tied to the backward pass (autograd graph task) that made them."""

    __slots__ = ("entries", "task")

    def __init__(self) -> None:
        self.entries: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.task = -1

    def add(self, task: int, *entry) -> None:
        """One mix's deferred data: ``(dh, u, coef)`` (``flush_deferred``) or ``(dh, u, alpha, rstd, c, index)``
        (:class:`AttnResMixDeferred`)."""
        if task != self.task:
            self.entries, self.task = [], task
        self.entries.append(entry)

    def take(self, task: int) -> list[tuple]:
        """This backward pass's entries (none if they came from another), and the block emptied."""
        entries = self.entries if self.task == task else []
        self.entries, self.task = [], -1
        return entries


def flush_deferred(sources: list[torch.Tensor], sinks: list[GradSink], block: DeferredBlock, task: int) -> None:
    """Add the gradients that ``block``'s mixes deferred for ``sources`` (the first ``C`` sources of each of them,
    each with a sink) into the sinks' buffers, started if need be, and empty the block."""
    entries = block.take(task)
    bufs, acc_mask = _sink_buffers(list(sinks), sources[0], task)
    if entries:
        dhs, us, coefs = (list(t) for t in zip(*entries))
        flush_triton(sources, bufs, acc_mask, dhs, us, coefs)


class AttnResMixDeferred(torch.autograd.Function):
    """``apply(u_all [Q, D], u [D], eps, sinks, block, flush, index, *sources) -> (h, alpha, partial)``: a mix of
    the stream's query ``index`` (``u = u_all[index]``) whose block-state gradients are formed by its block's flush
    with the score products there (``kernels/attn_res/defer_triton.py``, ``mix_triton.FLUSH_DOTS``).

    ``sources``: the ``C`` completed block states (each with a :class:`GradSink`) and, after the block's first
    sublayer, the block's running sum ``p`` (sink ``None``), contiguous ``[M, D]``. ``partial`` is ``p`` passed
    through (``None`` without it): the stream forms the next running sum from it, so that the backward receives that
    sum's gradient and adds it to ``p``'s own in one kernel (no separate gradient add). ``flush``: this mix is its
    block's first in forward order (the last to run backward); it forms every state's gradient from all of the
    block's mixes and returns the block's queries' gradients from the states through ``u_all``."""

    @staticmethod
    def forward(ctx, u_all: torch.Tensor, u: torch.Tensor, eps: float, sinks, block, flush: bool, index: int,
                *sources: torch.Tensor):
        h, rstd, alpha = mix_fwd_triton(list(sources), u, eps)
        _claim_sinks(ctx, sinks, len(sources))
        c = sum(s is not None for s in sinks)
        if ctx.sinks is None or any(s is None for s in sinks[:c]):
            raise ValueError("AttnResMixDeferred: the completed block states (the sources with a sink) must come "
                             f"first and take the pointer-argument path, got sinks {sinks}")
        ctx.num_states, ctx.block, ctx.flush, ctx.index, ctx.u_all_shape = c, block, flush, index, u_all.shape
        ctx.save_for_backward(u, rstd, alpha, h, *sources)
        ctx.mark_non_differentiable(alpha)
        ctx.set_materialize_grads(False)
        return h, alpha, (sources[c].view_as(sources[c]) if len(sources) > c else None)

    @staticmethod
    def backward(ctx, dh: torch.Tensor, _dalpha, d_next):
        u, rstd, alpha, h, *sources = ctx.saved_tensors
        c = ctx.num_states
        dh = _as_source(dh, sources[0])
        has_p = len(sources) > c
        g_next = _as_source(d_next, sources[0]) if has_p and d_next is not None else None
        dx_p, du, big_g = bwd_light(sources[c] if has_p else None, h, dh, g_next, u,
                                    alpha[c] if has_p else None, rstd[c] if has_p else None)
        task = torch._C._current_graph_task_id()
        ctx.block.add(task, dh, u, alpha, rstd, big_g, ctx.index)
        du_all = None
        dxs = [None] * c + ([dx_p] if has_p else [])
        if ctx.flush:
            du_all = flush_dots_deferred(sources[:c], ctx.sinks[:c], ctx.block, task, ctx.u_all_shape)
            dxs[:c] = [sink.buf for sink in ctx.sinks[:c]]
        grads = _source_grads(ctx, dxs, 7)
        return du_all, du if ctx.needs_input_grad[1] else None, None, None, None, None, None, *grads


def flush_dots_deferred(sources: list[torch.Tensor], sinks: list[GradSink], block: DeferredBlock, task: int,
                        u_all_shape: torch.Size) -> torch.Tensor:
    """Add the gradients that ``block``'s :class:`AttnResMixDeferred` mixes left for ``sources`` (their first ``C``)
    into the sinks' buffers (started if need be), empty the block, and return the block's queries' gradients from
    the states as fp32 ``u_all_shape`` (zero outside the block's rows)."""
    entries = sorted(block.take(task), key=lambda e: e[5])  # query order: one contiguous range of rows
    bufs, acc_mask = _sink_buffers(list(sinks), sources[0], task)
    q, d = u_all_shape
    if not entries:
        return torch.zeros(q, d, device=sources[0].device, dtype=torch.float32)
    dhs, us, alphas, rstds, cs, index = (list(t) for t in zip(*entries))
    du = flush_dots(sources, bufs, acc_mask, dhs, us, alphas, rstds, cs)
    lo = index[0]
    if index != list(range(lo, lo + len(index))):
        raise ValueError(f"flush_dots_deferred: a block's mixes must be consecutive queries, got {index}")
    return torch.nn.functional.pad(du, (0, 0, lo, q - lo - len(index)))


def _claim_sinks(ctx, sinks, n: int) -> None:
    """Record on ``ctx`` which sources' gradients go to a :class:`GradSink` and which mix returns each buffer."""
    ctx.sinks, ctx.returns = None, None
    if sinks is not None and any(s is not None for s in sinks) and use_args(n):
        ctx.sinks = list(sinks)
        ctx.returns = [s is not None and s.uses == 0 for s in sinks]
        for s in sinks:
            if s is not None:
                s.uses += 1


def _as_source(dh: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    return dh if dh.dtype == x0.dtype and dh.is_contiguous() else dh.to(x0.dtype).contiguous()


def _source_grads(ctx, dxs: list[torch.Tensor], first_input: int) -> list[torch.Tensor | None]:
    """The sources' gradients to hand autograd: ``None`` for a sink's buffer that another mix returns (the returning
    mix releases its buffer) and for inputs that need none (``first_input``: the index of the first source)."""
    grads = []
    for i, dx in enumerate(dxs):
        sink = None if ctx.sinks is None else ctx.sinks[i]
        if sink is not None:
            dx = dx if ctx.returns[i] else None
            if ctx.returns[i]:
                sink.buf = None  # released: the next backward pass starts a new buffer
        grads.append(dx if ctx.needs_input_grad[first_input + i] else None)
    return grads
