"""Memory-lean Attention-Residual mix as a PyTorch autograd function (the CPU path; ``naive.py`` is the spec).

Forward saves only fp32 ``rstd`` and ``alpha`` (``[N, *]``) besides the sources themselves, and the
backward recomputes the keys, so a call does not keep a stacked copy of its sources. Since
``w . (g * n) = (w * g) . n`` the maths uses ``u = w * g`` and the unit-RMS keys ``n_i = x_i * rstd_i``:

    ds_i = alpha_i (dh . x_i - sum_j alpha_j dh . x_j)
    dx_i = alpha_i dh + ds_i rstd_i (u - n_i (u . n_i) / D),   du = sum_tokens sum_i ds_i n_i
"""

from __future__ import annotations

import torch


def _up(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 (fp64 stays fp64, for gradcheck)."""
    return x if x.dtype == torch.float64 else x.float()


def _rstd(v: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(v.pow(2).mean(-1) + eps)


class AttnResMix(torch.autograd.Function):
    """``apply(weight [1, D] or [D], gain [D], eps, *sources [*, D]) -> (h [*, D], alpha [N, *] fp32)``."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, gain: torch.Tensor, eps: float, *sources: torch.Tensor):
        u = _up(weight).reshape(-1) * _up(gain)
        rstd = torch.stack([_rstd(_up(s), eps) for s in sources])  # [N, *]
        scores = torch.stack([(_up(s) @ u) for s in sources]) * rstd
        alpha = torch.softmax(scores, dim=0)
        h = alpha[0, ..., None] * _up(sources[0])
        for i in range(1, len(sources)):
            h = h + alpha[i, ..., None] * _up(sources[i])
        ctx.save_for_backward(weight, gain, rstd, alpha, *sources)
        ctx.mark_non_differentiable(alpha)
        return h.to(sources[0].dtype), alpha

    @staticmethod
    def backward(ctx, dh: torch.Tensor, _dalpha: torch.Tensor | None):
        weight, gain, rstd, alpha, *sources = ctx.saved_tensors
        d = sources[0].shape[-1]
        u = _up(weight).reshape(-1) * _up(gain)
        dhf = _up(dh)
        dalpha = torch.stack([(dhf * _up(s)).sum(-1) for s in sources])  # [N, *]
        ds = alpha * (dalpha - (alpha * dalpha).sum(0, keepdim=True))
        du = torch.zeros_like(u)
        grads = []
        for i, s in enumerate(sources):
            n = _up(s) * rstd[i, ..., None]
            score = (n @ u)[..., None]
            du = du + (ds[i, ..., None] * n).reshape(-1, d).sum(0)
            dv = alpha[i, ..., None] * dhf + (ds[i] * rstd[i])[..., None] * (u - n * score / d)
            grads.append(dv.to(s.dtype) if ctx.needs_input_grad[3 + i] else None)
        dweight = (du * _up(gain)).reshape(weight.shape).to(weight.dtype)
        dgain = (du * _up(weight).reshape(-1)).to(gain.dtype)
        return dweight, dgain, None, *grads
