"""Input validation and backend choice of the short-convolution operators (``docs/INTERFACES.md``, "Short
convolution").

Shapes: x ``[B, T, D]`` (B = 1 with ``cu_seqlens [N + 1]``); weight ``[D, W]``; bias ``[D]``; state
``[N, D, W-1]``; decode x ``[N, D]``. The backend is the ``backend`` argument, else ``KVL_CONV_BACKEND``
(``triton`` | ``torch``, named like ``KVL_KDA_BACKEND``), else Triton on CUDA and PyTorch elsewhere.
"""

from __future__ import annotations

import torch

from kernels.backend import choose_backend
from kernels.host_ints import host_ints

ACTIVATIONS = (None, "silu", "swish", "identity")


def fail(fn: str, msg: str) -> None:
    raise ValueError(f"{fn} (kernels/short_conv): {msg}")


def uses_silu(activation: str | None) -> bool:
    return activation in ("silu", "swish")


def resolve_backend(backend: str | None, device: torch.device, fn: str) -> str:
    """Explicit argument, else ``KVL_CONV_BACKEND``, else Triton on CUDA and PyTorch elsewhere."""
    return choose_backend(backend, device, fn, "kernels/short_conv", "KVL_CONV_BACKEND")


def check_params(fn: str, x: torch.Tensor, weight: torch.Tensor, bias, activation, state, N: int) -> None:
    """weight ``[D, W]``, bias ``[D]``, activation, state ``[N, D, W-1]`` against x's last dim."""
    if not x.is_floating_point():
        fail(fn, f"x must be floating point, got {x.dtype} {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[0] != x.shape[-1] or weight.shape[1] < 1:
        fail(fn, f"weight must be [D={x.shape[-1]}, W], got {tuple(weight.shape)} for x {tuple(x.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        fail(fn, f"bias must be [D={weight.shape[0]}], got {tuple(bias.shape)}")
    if activation not in ACTIVATIONS:
        fail(fn, f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    want = (N, weight.shape[0], weight.shape[1] - 1)
    if state is not None and tuple(state.shape) != want:
        fail(fn, f"state must be [N, D, W-1] = {want}, got {tuple(state.shape)}")


def check_conv(fn: str, x: torch.Tensor, weight, bias, activation, cu_seqlens, initial_state) -> int:
    """Validate a whole-sequence call; return the number of sequences N."""
    if x.dim() != 3:
        fail(fn, f"x must be [B, T, D], got {tuple(x.shape)}")
    B, T, _ = x.shape
    N = B
    if cu_seqlens is not None:
        if B != 1:
            fail(fn, f"with cu_seqlens the batch size must be 1, got x {tuple(x.shape)}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or cu_seqlens.is_floating_point():
            fail(fn, f"cu_seqlens must be a 1-D integer tensor [N + 1], got {cu_seqlens.dtype} "
                 f"{tuple(cu_seqlens.shape)}")
        c = host_ints(cu_seqlens)
        if c[0] != 0 or c[-1] != T:
            fail(fn, f"cu_seqlens must start at 0 and end at T={T}, got {c}")
        if any(b < a for a, b in zip(c[:-1], c[1:])):
            fail(fn, f"cu_seqlens must be non-decreasing, got {c}")
        N = len(c) - 1
    check_params(fn, x, weight, bias, activation, initial_state, N)
    return N


def check_update(fn: str, x: torch.Tensor, state: torch.Tensor, weight, bias, activation) -> None:
    """Validate a decode step: x ``[N, D]``, state ``[N, D, W-1]``."""
    if x.dim() != 2:
        fail(fn, f"x must be [N, D] (one token per sequence), got {tuple(x.shape)}")
    check_params(fn, x, weight, bias, activation, state, x.shape[0])
