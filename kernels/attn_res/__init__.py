"""Attention-Residual mix over depth (``../shared/REFERENCE.md`` section 3; Kimi "Attention Residuals").

Per token, over ``N`` sources ``x_n [*, D]``: keys ``k_n = RMSNorm(x_n) * gain``, scores ``s_n = w . k_n``,
``alpha = softmax_n(s)`` in fp32 (no temperature), ``h = sum_n alpha_n x_n``. Public entry points:
:func:`attn_res_mix` and :func:`attn_res_mix_norm` (the mix, then an RMSNorm of its output). One dispatch point:
``backend`` argument, else ``KVL_ATTNRES_BACKEND`` (``triton`` | ``torch``), else Triton on CUDA and the PyTorch
autograd function on CPU.

- ``naive.py``: stacked fp32/fp64 reference (the specification; tests only).
- ``mix_torch.py``: :class:`AttnResMix`, custom autograd function, keys recomputed in backward (CPU path).
- ``mix_triton.py``: fused forward/backward kernels and their launchers, sources read in place (GPU;
  ``TRITON_INTERPRET=1`` on CPU); ``GradSink``: in-place gradient accumulation of a source shared by several mixes.
- ``mix_norm_triton.py``: the pointer-argument mix and the RMSNorm of its output in one kernel each way.
- ``mix_autograd.py``: the kernels as autograd functions and the deferred block-state gradients (``DeferredBlock``).
- ``two_phase_triton.py``: the two-phase inference kernels over one buffer of block states (decode, prefill).

Example::

    import torch
    from kernels.attn_res import attn_res_mix
    xs = [torch.randn(2, 7, 48, requires_grad=True) for _ in range(3)]
    w, g = torch.zeros(1, 48, requires_grad=True), torch.ones(48, requires_grad=True)
    h, alpha = attn_res_mix(xs, w, g, eps=1e-6)   # h [2, 7, 48], alpha [3, 2, 7] fp32 (uniform: w = 0)
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from kernels.attn_res.mix_torch import AttnResMix
from kernels.attn_res.naive import attn_res_mix_naive

__all__ = ["AttnResMix", "attn_res_mix", "attn_res_mix_naive", "attn_res_mix_norm", "resolve_backend"]

_WHERE = "kernels/attn_res.attn_res_mix"
BACKENDS = ("torch", "triton")


def _validate(sources: Sequence[torch.Tensor], weight: torch.Tensor, gain: torch.Tensor) -> None:
    if len(sources) == 0:
        raise ValueError(f"{_WHERE}: sources must hold at least one tensor, got none")
    shape, device = sources[0].shape, sources[0].device
    for i, s in enumerate(sources):
        if s.shape != shape or s.device != device:
            raise ValueError(f"{_WHERE}: sources[{i}] is {tuple(s.shape)} on {s.device}, sources[0] is "
                             f"{tuple(shape)} on {device}; all must match")
    d = shape[-1] if len(shape) else 0
    if len(shape) < 1 or d == 0:
        raise ValueError(f"{_WHERE}: sources must be [*, D] with D > 0, got {tuple(shape)}")
    if weight.numel() != d or gain.shape != (d,):
        raise ValueError(f"{_WHERE}: weight must have D={d} elements and gain be [D], got weight "
                         f"{tuple(weight.shape)}, gain {tuple(gain.shape)}")


def _triton_supported(x: torch.Tensor) -> bool:
    from kernels.attn_res.mix_triton import DTYPES, MAX_D

    return x.dtype in DTYPES and x.shape[-1] <= MAX_D and x.numel() > 0


def resolve_backend(x: torch.Tensor, backend: str | None = None) -> str:
    """The backend a call on sources like ``x`` uses: argument, else ``KVL_ATTNRES_BACKEND``, else by device.

    Unforced, Triton is used on CUDA for fp32/fp16/bf16 with ``D <= 16384`` and PyTorch otherwise; a forced
    ``triton`` on a CPU tensor needs ``TRITON_INTERPRET=1``."""
    forced = backend or os.environ.get("KVL_ATTNRES_BACKEND") or None
    if forced is not None and forced not in BACKENDS:
        raise ValueError(f"{_WHERE}: backend (or KVL_ATTNRES_BACKEND) must be one of {BACKENDS}, got {forced!r}")
    if forced is None:
        return "triton" if x.is_cuda and _triton_supported(x) else "torch"
    if forced == "triton":
        if not _triton_supported(x):
            raise ValueError(f"{_WHERE}: the Triton backend takes fp32/fp16/bf16 sources with D <= 16384, got "
                             f"{x.dtype} {tuple(x.shape)}")
        if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"{_WHERE}: backend 'triton' on a {x.device} tensor needs TRITON_INTERPRET=1")
    return forced


def _query_product(weight: torch.Tensor, gain: torch.Tensor, u: torch.Tensor | None, d: int) -> torch.Tensor:
    """``u = weight * gain`` as fp32 ``[D]``, or the caller's precomputed ``u`` after a shape and dtype check."""
    if u is None:
        return weight.float().reshape(-1) * gain.float()
    if u.shape != (d,) or u.dtype != torch.float32:
        raise ValueError(f"{_WHERE}: u must be fp32 [D={d}], got {u.dtype} {tuple(u.shape)}")
    return u


def attn_res_mix(sources: Sequence[torch.Tensor], weight: torch.Tensor, gain: torch.Tensor, eps: float,
                 backend: str | None = None, sinks: Sequence | None = None, u: torch.Tensor | None = None,
                 defer: tuple | None = None, chain: bool = False) -> tuple:
    """Softmax mix over depth of ``sources``; differentiable in the sources, ``weight`` and ``gain``.

    Args:
        sources: ``N >= 1`` tensors ``[*, D]`` of one shape and device (raw sublayer outputs, not normalised);
            they are cast to the dtype of ``sources[0]`` if they differ.
        weight: the pseudo-query, ``D`` elements (e.g. ``[1, D]``, a bias-free ``Linear(D, 1)`` weight).
        gain: key RMSNorm gain ``[D]``.
        eps: key RMSNorm epsilon.
        backend: ``None``, ``"torch"`` or ``"triton"`` (see :func:`resolve_backend`).
        sinks: optional, one ``mix_triton.GradSink`` or ``None`` per source: on the Triton pointer-argument path
            the gradients of a source shared by several mixes are accumulated in place in its sink (see
            ``GradSink``); ignored elsewhere (plain autograd accumulation, same values).
        u: optional ``weight * gain`` as fp32 ``[D]``, already computed (differentiable) by the caller, e.g. one
            row of a product taken once for many queries; the Triton path then skips its own product (the
            PyTorch path uses ``weight`` and ``gain``).
        defer: optional ``(mix_autograd.DeferredBlock, flush)``: on the Triton pointer-argument path the gradients
            of the sources with a sink are formed once for all the mixes of a block (see ``DeferredBlock``);
            ignored elsewhere (same values to rounding).
        chain: return a third value: ``sources[-1]`` passed through on the Triton pointer-argument path when it is
            contiguous and of ``sources[0]``'s dtype (``None`` otherwise: no copy is passed on). Build the next
            running sum from it (``passed + out``) and the kernel adds the last source's gradient into that sum's
            gradient in place, instead of autograd's add of two tensors.

    Returns:
        ``h [*, D]`` in the dtype of ``sources[0]`` and ``alpha [N, *]`` fp32 (not differentiable); with ``chain``
        also the passed-through last source or ``None``.
    """
    _validate(sources, weight, gain)
    x0 = sources[0]
    if resolve_backend(x0, backend) == "torch":
        h, alpha = AttnResMix.apply(weight, gain, eps, *sources)
        return (h, alpha, None) if chain else (h, alpha)
    from kernels.attn_res.mix_autograd import AttnResMixTriton

    return _apply_triton(AttnResMixTriton, sources, weight, gain, eps, sinks, u, defer, chain)


def _apply_triton(function, sources: Sequence[torch.Tensor], weight: torch.Tensor, gain: torch.Tensor, eps: float,
                  sinks: Sequence | None, u: torch.Tensor | None, defer: tuple | None, chain: bool,
                  extra: tuple = ()) -> tuple:
    """``function.apply(u, eps, sinks, defer, pass_on, *extra, *sources)`` on the sources flattened to ``[M, D]``
    (cast to ``sources[0]``'s dtype, contiguous), its ``[M, D]`` output and alpha reshaped back."""
    x0 = sources[0]
    lead, d = x0.shape[:-1], x0.shape[-1]
    flat = [s.to(x0.dtype).reshape(-1, d).contiguous() for s in sources]
    u = _query_product(weight, gain, u, d)
    pass_on = chain and sources[-1].dtype == x0.dtype and sources[-1].is_contiguous()  # flat[-1] is then a view
    out, alpha, passed = function.apply(u, eps, None if sinks is None else tuple(sinks), defer, pass_on, *extra, *flat)
    out, alpha = out.reshape(*lead, d), alpha.reshape(len(sources), *lead)
    if not chain:
        return out, alpha
    return out, alpha, None if passed is None else passed.reshape(*lead, d)


def attn_res_mix_norm(sources: Sequence[torch.Tensor], weight: torch.Tensor, gain: torch.Tensor, eps: float,
                      norm_weight: torch.Tensor, norm_eps: float, backend: str | None = None,
                      sinks: Sequence | None = None, u: torch.Tensor | None = None, defer: tuple | None = None,
                      chain: bool = False) -> tuple:
    """``kernels.norm.rms_norm(h, norm_weight, norm_eps)`` of the mix ``h`` of :func:`attn_res_mix` (same arguments,
    the same values to rounding): the sublayer input of an AttnRes stream. On the Triton pointer-argument path with
    at most ``mix_norm_triton.MAX_SOURCES`` sources one kernel does both each way and ``h`` is never stored (see
    ``mix_norm_triton.py``); elsewhere the mix, then the norm.

    Returns ``y [*, D]`` (the promoted dtype of ``sources[0]`` and ``norm_weight``) and ``alpha [N, *]``; with
    ``chain`` also the passed-through last source or ``None``."""
    from kernels.norm import rms_norm

    _validate(sources, weight, gain)
    x0 = sources[0]
    d = x0.shape[-1]
    if norm_weight.shape != (d,):
        raise ValueError(f"{_WHERE}_norm: norm_weight must be [D={d}], got {tuple(norm_weight.shape)}")
    from kernels.attn_res.mix_norm_triton import fusable

    if resolve_backend(x0, backend) == "torch" or not fusable(len(sources)):
        out = attn_res_mix(sources, weight, gain, eps, backend, sinks, u, defer, chain)
        return (rms_norm(out[0], norm_weight, norm_eps), *out[1:])
    from kernels.attn_res.mix_autograd import AttnResMixNormTriton

    return _apply_triton(AttnResMixNormTriton, sources, weight, gain, eps, sinks, u, defer, chain,
                         (norm_weight, norm_eps))
