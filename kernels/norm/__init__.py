"""RMSNorm, gated RMSNorm (the KDA output norm), LayerNorm (the vision tower's) and the SwiGLU activation, fused.

    rms_norm(x, weight, eps)             = weight * (x / sqrt(mean(x^2) + eps)).to(x.dtype)
    add_rms_norm(x, r, weight, eps)      = (s, rms_norm(s, weight, eps)) with s = (x + r).to(x.dtype)
    gated_rms_norm(x, gate, weight, eps) = (weight * x / sqrt(mean(x^2) + eps) * sigmoid(gate)).to(x.dtype)
    layer_norm(x, weight, bias, eps)     = ((x - mean(x)) / sqrt(var(x) + eps) * weight + bias).to(x.dtype)
    silu_mul(gate_up)                    = silu(gate_up[..., :I]) * gate_up[..., I:]

Statistics and the gated product in fp32 (``norm_torch.py`` states the rounding points). Two implementations
behind one dispatch point: ``norm_torch.py`` (PyTorch, the reference and the CPU path) and ``norm_triton.py``
(one Triton kernel per direction, fp32 statistics, deterministic weight gradients). The ``backend`` argument,
else ``KVL_NORM_BACKEND=triton|torch``, else Triton on CUDA and PyTorch elsewhere;
``KVL_NORM_BACKEND=triton TRITON_INTERPRET=1`` runs the Triton kernels on a CPU.

Shapes: x, gate ``[..., D]``; weight, bias ``[D]``; gate_up ``[..., 2I]`` -> ``[..., I]``.
"""

from __future__ import annotations

import torch

from kernels.backend import choose_backend
from kernels.norm.norm_torch import gated_rms_norm_torch, layer_norm_torch, rms_norm_torch, silu_mul_torch

__all__ = ["add_rms_norm", "rms_norm", "gated_rms_norm", "layer_norm", "silu_mul", "rms_norm_torch", "gated_rms_norm_torch",
           "layer_norm_torch", "silu_mul_torch"]

MAX_D = 16384  # the fused kernels hold a whole row of D in registers; wider rows take the PyTorch path


def _fail(fn: str, msg: str) -> None:
    raise ValueError(f"{fn} (kernels/norm): {msg}")


def resolve_backend(backend: str | None, device: torch.device, fn: str) -> str:
    """Explicit argument, else ``KVL_NORM_BACKEND``, else Triton on CUDA and PyTorch elsewhere."""
    return choose_backend(backend, device, fn, "kernels/norm", "KVL_NORM_BACKEND")


def _check_norm(fn: str, x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor | None) -> None:
    if not x.is_floating_point() or x.dim() < 1:
        _fail(fn, f"x must be a floating-point tensor [..., D], got {x.dtype} {tuple(x.shape)}")
    if weight.shape != (x.shape[-1],):
        _fail(fn, f"weight must be [D={x.shape[-1]}], got {tuple(weight.shape)} for x {tuple(x.shape)}")
    if gate is not None and gate.shape != x.shape:
        _fail(fn, f"gate must have x's shape {tuple(x.shape)}, got {tuple(gate.shape)}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, backend: str | None = None) -> torch.Tensor:
    """RMSNorm over the last dim of ``x [..., D]`` with gain ``weight [D]``; returns x's shape and dtype."""
    _check_norm("rms_norm", x, weight, None)
    if resolve_backend(backend, x.device, "rms_norm") == "torch" or x.shape[-1] > MAX_D:
        return rms_norm_torch(x, weight, eps)
    return _triton_norm(x, None, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                 backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, rms_norm(s, weight, eps))`` with ``s = x + residual`` in x's dtype: a PreNorm residual update and the
    next sublayer's input norm. The Triton backend does both in one launch; with a gradient to record, through
    ``AddNormFunction``, whose backward also adds the stream's gradient inside the norm's backward launch (in fp32,
    one rounding, where autograd over the two ops rounds the norm's gradient and then adds). The PyTorch backend is
    the two ops."""
    _check_norm("add_rms_norm", x, weight, None)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        _fail("add_rms_norm", f"residual must match x {x.dtype} {tuple(x.shape)}, got {residual.dtype} "
                              f"{tuple(residual.shape)}")
    if resolve_backend(backend, x.device, "add_rms_norm") == "torch" or x.shape[-1] > MAX_D:
        s = x + residual
        return s, rms_norm(s, weight, eps, backend)
    from kernels.norm.norm_triton import AddNormFunction, add_norm_fwd

    if torch.is_grad_enabled() and (x.requires_grad or residual.requires_grad or weight.requires_grad):
        return AddNormFunction.apply(x, residual, weight, eps)
    return add_norm_fwd(x.contiguous(), residual.contiguous(), weight.contiguous(), eps)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                   backend: str | None = None) -> torch.Tensor:
    """RMSNorm of ``x [..., D]`` times ``weight [D]`` times ``sigmoid(gate [..., D])``, fp32 inside."""
    _check_norm("gated_rms_norm", x, weight, gate)
    if resolve_backend(backend, x.device, "gated_rms_norm") == "torch" or x.shape[-1] > MAX_D:
        return gated_rms_norm_torch(x, gate, weight, eps)
    return _triton_norm(x, gate, weight, eps)


def _triton_norm(x: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Triton norm; without a gradient to record (decode, ``no_grad`` evaluation) the forward kernel is called
    directly, skipping the autograd function's host work (decode is launch-bound on a GPU)."""
    from kernels.norm.norm_triton import NormFunction, norm_fwd

    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (gate is not None and gate.requires_grad)):
        return NormFunction.apply(x, gate, weight, eps)
    d = x.shape[-1]
    y, _ = norm_fwd(x.reshape(-1, d).contiguous(), None if gate is None else gate.reshape(-1, d).contiguous(),
                    weight.contiguous(), eps)
    return y.view(x.shape)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5,
               backend: str | None = None) -> torch.Tensor:
    """LayerNorm over the last dim of ``x [..., D]`` with gain ``weight [D]`` and ``bias [D]``: statistics and the
    affine map in fp32, the result in x's dtype (under autocast F.layer_norm returns fp32 instead; its consumers, the
    vision tower's matmuls, cast it back to x's dtype, which is where this rounds)."""
    _check_norm("layer_norm", x, weight, None)
    if bias.shape != weight.shape:
        _fail("layer_norm", f"bias must be [D={x.shape[-1]}], got {tuple(bias.shape)}")
    if resolve_backend(backend, x.device, "layer_norm") == "torch" or x.shape[-1] > MAX_D:
        return layer_norm_torch(x, weight, bias, eps)
    from kernels.norm.norm_triton import LayerNormFunction, layer_norm_fwd

    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or bias.requires_grad):
        return LayerNormFunction.apply(x, weight, bias, eps)
    d = x.shape[-1]
    return layer_norm_fwd(x.reshape(-1, d).contiguous(), weight.contiguous(), bias.contiguous(), eps)[0].view(x.shape)


def silu_mul(gate_up: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """SwiGLU activation of ``gate_up [..., 2I]`` (gate half first): ``[..., I]``."""
    if not gate_up.is_floating_point() or gate_up.dim() < 1 or gate_up.shape[-1] % 2:
        _fail("silu_mul", f"gate_up must be floating point [..., 2I], got {gate_up.dtype} {tuple(gate_up.shape)}")
    if resolve_backend(backend, gate_up.device, "silu_mul") == "torch":
        return silu_mul_torch(gate_up)
    from kernels.norm.norm_triton import SiluMulFunction

    return SiluMulFunction.apply(gate_up)
