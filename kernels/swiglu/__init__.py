"""The dense SwiGLU feed-forward ``y = (silu(x W_g^T) * (x W_u^T)) W_down^T`` as one op with two implementations:

    swiglu_mlp(x, w_gate_up, w_down, impl=None) -> y

- ``"split"`` (:func:`swiglu_split`): ``F.linear`` for the three matmuls and ``kernels.norm.silu_mul`` between
  them (its fused Triton kernel on CUDA); the measured path and the default everywhere.
- ``"fused"`` (:class:`~kernels.swiglu.swiglu_triton.SwiGLUGemmFunction`): the activation inside Triton GEMMs,
  forward (gate/up GEMM + ``silu_mul``) and backward (``dh`` GEMM + the activation's backward); the other matmuls
  stay ``torch`` calls. Not timed yet: ``kernels/benchmarks/bench_swiglu.py`` decides whether it becomes the
  CUDA default.

``impl``: the argument, else ``KVL_SWIGLU_IMPL=split|fused``, else ``"split"``. ``"fused"`` needs CUDA or
``TRITON_INTERPRET=1`` (the kernels then run on a CPU).

Shapes: ``x [..., K]``; ``w_gate_up [2I, K]`` (the gate's rows, then up's: ``torch.cat([gate.weight,
up.weight])``); ``w_down [D, I]``; ``y [..., D]``. Both implementations take the same rounding points (``g``,
``u``, ``h`` and ``dh`` in the compute dtype, the activation in fp32).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from kernels.backend import require_triton_device
from kernels.norm import silu_mul
from kernels.swiglu.swiglu_triton import SwiGLUGemmFunction

__all__ = ["IMPLS", "SwiGLUGemmFunction", "resolve_impl", "swiglu_mlp", "swiglu_split"]

IMPLS = ("split", "fused")
ENV_VAR = "KVL_SWIGLU_IMPL"


def resolve_impl(impl: str | None, device: torch.device) -> str:
    """The argument, else ``KVL_SWIGLU_IMPL``, else ``"split"``; errors name the variable and the value."""
    choice = impl if impl is not None else os.environ.get(ENV_VAR) or "split"
    if choice not in IMPLS:
        raise ValueError(f"swiglu_mlp (kernels/swiglu): impl must be one of {IMPLS} (argument or {ENV_VAR}), "
                         f"got {choice!r}")
    if choice == "fused":
        require_triton_device(device, "swiglu_mlp (kernels/swiglu)", "impl 'fused'")
    return choice


def _check(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> None:
    def fail(msg: str) -> None:
        raise ValueError(f"swiglu_mlp (kernels/swiglu): {msg}")

    if not x.is_floating_point() or x.dim() < 1:
        fail(f"x must be a floating-point tensor [..., K], got {x.dtype} {tuple(x.shape)}")
    if w_gate_up.dim() != 2 or w_gate_up.shape[0] % 2 or w_gate_up.shape[1] != x.shape[-1]:
        fail(f"w_gate_up must be [2I, K={x.shape[-1]}], got {tuple(w_gate_up.shape)}")
    if w_down.dim() != 2 or 2 * w_down.shape[1] != w_gate_up.shape[0]:
        fail(f"w_down must be [D, I={w_gate_up.shape[0] // 2}], got {tuple(w_down.shape)}")


def swiglu_split(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """The reference: three ``F.linear`` calls with ``silu_mul`` between them (autograd does the backward)."""
    return F.linear(silu_mul(F.linear(x, w_gate_up)), w_down)


def swiglu_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, impl: str | None = None) -> torch.Tensor:
    """``y [..., D]`` of ``x [..., K]``, ``w_gate_up [2I, K]``, ``w_down [D, I]`` through ``impl``."""
    _check(x, w_gate_up, w_down)
    if resolve_impl(impl, x.device) == "split":
        return swiglu_split(x, w_gate_up, w_down)
    return SwiGLUGemmFunction.apply(x, w_gate_up, w_down)
