"""Input validation and backend choice of the fused cross entropy (``kernels/cross_entropy``).

Shapes: logits ``[N, V]`` or ``[B, T, V]`` (fp32 / bf16 / fp16; fp64 is accepted and computed in fp32 like the
reference); target ``[N]`` or ``[B, T]`` (integer class ids in ``[0, V)`` or ``ignore_index``). The backend is
the ``backend`` argument, else ``KVL_CE_BACKEND`` (``triton`` | ``torch``, named like ``KVL_CONV_BACKEND``),
else Triton on CUDA and PyTorch elsewhere.
"""

from __future__ import annotations

import torch

from kernels.backend import choose_backend

REDUCTIONS = ("none", "mean", "sum")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # computed in fp32 either way


def fail(fn: str, msg: str) -> None:
    raise ValueError(f"{fn} (kernels/cross_entropy): {msg}")


def resolve_backend(backend: str | None, device: torch.device, fn: str) -> str:
    """Explicit argument, else ``KVL_CE_BACKEND``, else Triton on CUDA and PyTorch elsewhere."""
    return choose_backend(backend, device, fn, "kernels/cross_entropy", "KVL_CE_BACKEND")


def check_inputs(fn: str, logits: torch.Tensor, target: torch.Tensor, reduction: str) -> None:
    """logits ``[N, V]`` / ``[B, T, V]`` of a float dtype in ``DTYPES``; target of shape ``logits.shape[:-1]``, integer."""
    if logits.dim() not in (2, 3) or logits.shape[-1] < 1:
        fail(fn, f"logits must be [N, V] or [B, T, V] with V >= 1, got {tuple(logits.shape)}")
    if logits.dtype not in DTYPES:
        fail(fn, f"logits must be float32, bfloat16, float16 or float64, got {logits.dtype} {tuple(logits.shape)}")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        fail(fn, f"target must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])}, got "
             f"{tuple(target.shape)} (logits {tuple(logits.shape)})")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        fail(fn, f"target must be an integer tensor of class ids, got {target.dtype} {tuple(target.shape)}")
    if target.device != logits.device:
        fail(fn, f"target is on {target.device} but logits on {logits.device}")
    if reduction not in REDUCTIONS:
        fail(fn, f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
