"""Autograd of the fused AttnRes mix (``mix_triton.py`` holds the kernels and their launchers): the mix as a
``torch.autograd.Function``, with in-place gradient accumulation of shared sources (``sinks.GradSink``) and
the deferred block-state gradients (:class:`DeferredBlock`)."""

from __future__ import annotations

import torch

from kernels.attn_res.mix_norm_triton import mix_norm_bwd_triton, mix_norm_fwd_triton
from kernels.attn_res.mix_triton import (
    GradSink,
    flush_triton,
    mix_bwd_triton,
    mix_fwd_triton,
    use_args,
)
from kernels.attn_res.sinks import sink_buffers


class AttnResMixTriton(torch.autograd.Function):
    """``apply(u [D] fp32, eps, sinks, defer, *sources [M, D]) -> (h [M, D], alpha [N, M] fp32)``, ``u = w * gain``.

    Sources must be contiguous, of one dtype in :data:`DTYPES` and on one device (the public wrapper
    ``kernels.attn_res.attn_res_mix`` checks, casts and flattens). ``u`` is differentiable: its product with the
    weight and gain stays outside (one product for all of a forward's queries in the model's stream), so a mix
    costs no per-call launches for it. ``sinks``: ``None`` or one :class:`GradSink` or ``None`` per source (used
    only on the pointer-argument path). ``defer``: ``None`` or ``(block, flush)``: the gradients of the sources
    with a sink are deferred to ``block`` (a :class:`DeferredBlock`), and the mix with ``flush`` (the block's first
    in forward order, so the last to run backward) forms them for all of the block's mixes at once.

    ``chain``: return the last source passed through as a third output (else ``None``), for the caller to build the
    next running sum from (``next = passed + out``): that sum's gradient then comes back here and the kernel adds the
    last source's gradient into it in place (a gradient sink started by the later sum) instead of autograd adding two
    tensors (pointer-argument path; a read of the running sum's size instead of an add's two reads and a write)."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, eps: float, sinks, defer, chain: bool, *sources: torch.Tensor):
        h, rstd, alpha = mix_fwd_triton(list(sources), u, eps)
        ctx.save_for_backward(u, rstd, alpha, *sources)
        ctx.mark_non_differentiable(alpha)
        ctx.set_materialize_grads(False)  # alpha's gradient stays None instead of a zero-filled [N, M] (a launch a mix)
        return h, alpha, _setup(ctx, sinks, defer, chain, sources)

    @staticmethod
    def backward(ctx, dh: torch.Tensor, _dalpha: torch.Tensor | None, d_next: torch.Tensor | None):
        u, rstd, alpha, *sources = ctx.saved_tensors
        dh = _as_source(dh, sources[0])  # never None: h is the only differentiable output, so it has a gradient
        task = torch._C._current_graph_task_id()
        dxs, du, coef = mix_bwd_triton(sources, u, dh, rstd, alpha, _bwd_sinks(ctx, d_next, sources, task),
                                       ctx.defer_mask)
        _deferred(ctx, dh, u, coef, dxs, sources, task)
        return du if ctx.needs_input_grad[0] else None, None, None, None, None, *_source_grads(ctx, dxs, 5)


class AttnResMixNormTriton(torch.autograd.Function):
    """:class:`AttnResMixTriton` followed by the sublayer's input RMSNorm, in one kernel each way
    (``mix_norm_triton.py``): ``apply(u, eps, sinks, defer, chain, norm_weight, norm_eps, *sources) -> (y, alpha,
    passed)`` with ``y = rms_norm(h, norm_weight, norm_eps)``; ``h`` is never stored. Same sinks, deferral and chain;
    a deferring mix's backward stores ``dh`` for its block's flush."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, eps: float, sinks, defer, chain: bool, norm_weight: torch.Tensor,
                norm_eps: float, *sources: torch.Tensor):
        y, hr, rstd, alpha = mix_norm_fwd_triton(list(sources), u, eps, norm_weight, norm_eps)
        ctx.save_for_backward(u, norm_weight, hr, rstd, alpha, *sources)
        ctx.mark_non_differentiable(alpha)
        ctx.set_materialize_grads(False)
        return y, alpha, _setup(ctx, sinks, defer, chain, sources)

    @staticmethod
    def backward(ctx, dy: torch.Tensor, _dalpha: torch.Tensor | None, d_next: torch.Tensor | None):
        u, nw, hr, rstd, alpha, *sources = ctx.saved_tensors
        task = torch._C._current_graph_task_id()
        dxs, du, dw, coef, dh = mix_norm_bwd_triton(
            sources, u, nw, dy.contiguous(), hr, rstd, alpha, _bwd_sinks(ctx, d_next, sources, task), ctx.defer_mask,
            store_dh=ctx.defer is not None)
        _deferred(ctx, dh, u, coef, dxs, sources, task)
        return (du if ctx.needs_input_grad[0] else None, None, None, None, None,
                dw if ctx.needs_input_grad[5] else None, None, *_source_grads(ctx, dxs, 7))


def _setup(ctx, sinks, defer, chain: bool, sources) -> torch.Tensor | None:
    """The forward's bookkeeping of both functions: the sinks claimed, the deferral recorded, and the last source
    passed through for the chain (or ``None``)."""
    _claim_sinks(ctx, sinks, len(sources))
    ctx.defer, ctx.defer_mask = None, 0
    if defer is not None and ctx.sinks is not None:
        ctx.defer = defer
        ctx.defer_mask = sum(1 << i for i, sink in enumerate(ctx.sinks) if sink is not None)
    chain = chain and use_args(len(sources)) and (ctx.sinks is None or ctx.sinks[-1] is None)
    return sources[-1].view_as(sources[-1]) if chain else None


def _bwd_sinks(ctx, d_next: torch.Tensor | None, sources: list[torch.Tensor], task: int) -> list | None:
    """The backward kernel's sinks: the forward's, and with ``d_next`` (the next running sum's gradient) a sink that
    adds the last source's gradient into it."""
    if d_next is None:
        return ctx.sinks
    chained = GradSink()
    chained.buf, chained.task = _as_source(d_next, sources[0]), task
    return [*(ctx.sinks or [None] * len(sources))[:-1], chained]


def _deferred(ctx, dh: torch.Tensor, u: torch.Tensor, coef: torch.Tensor | None, dxs: list, sources: list,
              task: int) -> None:
    """A deferring mix's part of its block: its ``dh``, ``u`` and coefficients kept, and for the block's flushing mix
    every deferred gradient formed (into ``dxs``)."""
    if ctx.defer is None:
        return
    block, flush = ctx.defer
    block.add(task, dh, u, coef)
    if flush:
        c = ctx.defer_mask.bit_length()  # the deferred sources are the first c (the completed block states)
        flush_deferred(sources[:c], ctx.sinks[:c], block, task)
        dxs[:c] = [sink.buf for sink in ctx.sinks[:c]]


class DeferredBlock:
    """The deferred source gradients of one AttnRes block's mixes (``KVL_ATTNRES_DEFER_GRAD``).

    Every mix of a block reads the same completed block states. Without deferral each mix's backward adds its
    ``dx`` into each state's :class:`GradSink` buffer (a read and a write of ``[M, D]`` per state and mix). With
    it, a mix's backward stores per token only ``(alpha, k, e)`` of ``dx = alpha dh + k u - e x`` (12 bytes a
    token and state) and keeps its ``dh``; the block's first mix, the last to run backward, then forms every
    state's gradient from all of them in one kernel (:func:`flush_deferred`): per state one read of ``x``, one
    read and write of the buffer, and the ``S`` ``dh`` tiles (read once from memory, again from L2), summed in
    fp32 and rounded once. Entries are tied to the backward pass (autograd graph task) that made them.

    Removed variant (session 34, H200, small hybrid 8 x 4096): the products ``dh . x`` of the block states formed in
    the flush instead, each mix's own backward reading only ``dh``, ``h`` (``sum_j alpha_j dh . x_j = dh . h``) and
    its running sum and adding the next running sum's gradient itself: mixes 2.20 -> 1.65 ms, adds -0.66 ms, but the
    flush 0.94 -> 3.35 ms (cross-warp products, spills), the step +1 ms; and bf16 gradients against fp64 up to 1.6e-1
    against 6.4e-2 (``dh . h`` from the rounded ``h`` does not cancel like the per-mix sum); ``docs/results/
    gpu-2026-11-30-s34/``."""

    __slots__ = ("entries", "task")

    def __init__(self) -> None:
        self.entries: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.task = -1

    def add(self, task: int, dh: torch.Tensor, u: torch.Tensor, coef: torch.Tensor) -> None:
        if task != self.task:
            self.entries, self.task = [], task
        self.entries.append((dh, u, coef))


def flush_deferred(sources: list[torch.Tensor], sinks: list[GradSink], block: DeferredBlock, task: int) -> None:
    """Add the gradients that ``block``'s mixes deferred for ``sources`` (the first ``C`` sources of each of them,
    each with a sink) into the sinks' buffers, started if need be, and empty the block."""
    entries = block.entries if block.task == task else []
    block.entries, block.task = [], -1
    bufs, acc_mask = sink_buffers(list(sinks), sources[0], task)
    if entries:
        dhs, us, coefs = (list(t) for t in zip(*entries))
        flush_triton(sources, bufs, acc_mask, dhs, us, coefs)


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
