"""``shared_input_linear``: several linear maps of one input as one autograd node.

A layer that projects the same activation ``x [..., D]`` with several weights (the KDA layer: ``q|k|v``, and the
small ``f_a | g_a | b`` projections; MLA: the query and the latent ``kv_a``) gives ``x`` one consumer per weight.
Autograd then forms one ``dx_i = dy_i W_i`` per consumer and adds them up one pair at a time: each extra consumer
costs a GEMM output of ``x``'s size plus an add that reads two such tensors and writes a third. Here the backward
accumulates into one buffer instead (``dx = dy_0 W_0``, then ``dx += dy_i W_i`` as in-place ``addmm_``, whose
GEMM reads and writes ``dx`` once), and the weight gradients are ``dy_i^T x`` as before. Same maths as separate
``F.linear`` calls; only the order of the fp32 → 16-bit roundings of ``dx`` differs (each partial sum is rounded
to ``x``'s dtype, as autograd's pairwise adds round theirs).

Under autocast the maps run in the autocast dtype like ``F.linear`` and the saved input is the cast copy; the
gradients come back in each input's own dtype. Outputs that get no gradient are skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


class SharedInputLinear(torch.autograd.Function):
    """``(x, n, *weights, *biases) -> tuple(F.linear(x, w_i, b_i))``; biases may be None."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, n: int, *params: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        weights, biases = params[:n], params[n:]
        ys = tuple(F.linear(x, w, b) for w, b in zip(weights, biases))
        cdt = ys[0].dtype  # the compute dtype (autocast's, else the inputs')
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x.reshape(-1, x.shape[-1]).to(cdt), *weights)
        ctx.x_shape, ctx.x_dtype, ctx.has_bias = x.shape, x.dtype, [b is not None for b in biases]
        return ys

    @staticmethod
    def backward(ctx, *dys: torch.Tensor | None):
        x2, *weights = ctx.saved_tensors
        need_x = ctx.needs_input_grad[0]
        dx, dws, dbs = None, [], []
        for i, (w, dy) in enumerate(zip(weights, dys)):
            if dy is None:
                dws.append(None)
                dbs.append(None)
                continue
            g = dy.reshape(-1, dy.shape[-1]).to(x2.dtype)
            if need_x:
                wc = w.to(g.dtype)
                dx = g @ wc if dx is None else dx.addmm_(g, wc)
            dws.append((g.t() @ x2).to(w.dtype) if ctx.needs_input_grad[2 + i] else None)
            dbs.append(g.sum(0).to(w.dtype) if ctx.has_bias[i] and ctx.needs_input_grad[2 + len(weights) + i]
                       else None)
        if dx is not None:
            dx = dx.view(ctx.x_shape).to(ctx.x_dtype)
        return (dx, None, *dws, *dbs)


def shared_input_linear(x: torch.Tensor, weights: Sequence[torch.Tensor],
                        biases: Sequence[torch.Tensor | None] | None = None) -> tuple[torch.Tensor, ...]:
    """``tuple(F.linear(x, w_i, b_i) for each weight)`` with one backward that accumulates ``dx`` in place.

    x ``[..., D]``; weights ``[N_i, D]``; biases ``[N_i]`` or None. Returns ``[..., N_i]`` tensors (contiguous)."""
    weights = list(weights)
    biases = [None] * len(weights) if biases is None else list(biases)
    if not weights or len(biases) != len(weights):
        raise ValueError(f"shared_input_linear: need one or more weights and as many biases (or None), got "
                         f"{len(weights)} weights and {len(biases)} biases")
    for i, w in enumerate(weights):
        if w.dim() != 2 or w.shape[1] != x.shape[-1]:
            raise ValueError(f"shared_input_linear: weights[{i}] must be [N, {x.shape[-1]}] for x of shape "
                             f"{tuple(x.shape)}, got {tuple(w.shape)}")
    return SharedInputLinear.apply(x, len(weights), *weights, *biases)
