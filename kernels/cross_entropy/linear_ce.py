"""The LM head and its cross entropy as one autograd node, for training steps that never read the logits.

``losses_N = cross_entropy(x_ND @ w_VD^T, target_N)`` per row. With separate ops the loss reads the bf16 logits in
its forward and again in its backward, which also writes their gradient into a second logits-sized buffer (2.1 GB
each at the ``small`` model's 32768 rows x 32768 classes). Here the forward writes each row's gradient for an
upstream gradient of 1, ``softmax - onehot``, over the logits as soon as the row's loss is known
(``ce_triton._ce_fwd_grad_kernel``, the row read twice in a row); the backward applies the rows' upstream
gradients ``g_N`` to the head's small operands instead of the logits: ``dx = g (D w)`` and ``dw = D^T (g x)`` with
``D`` the stored gradient. One logits-sized buffer fewer, and one read of the logits fewer where the kernel holds
a whole row in registers (``ce_triton.FWD_GRAD_MODE``, up to 32768 classes); the logits are not returned.

Used by the model's head in training (``kimi_vl.modeling.head.LMHead``, the models' ``return_logits=False``). GPU
timing against ``F.linear`` + :func:`kernels.cross_entropy.cross_entropy`: ``bench_cross_entropy.py --linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.cross_entropy.api import DTYPES, REDUCTIONS, fail, resolve_backend
from kernels.cross_entropy.naive import cross_entropy_torch


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Per-row loss ``[N]`` fp32 of ``x_ND @ w_VD^T`` against ``target_N``; see the module docstring."""

    @staticmethod
    def forward(ctx, x_ND: torch.Tensor, w_VD: torch.Tensor, target_N: torch.Tensor, ignore_index: int):
        from kernels.cross_entropy.ce_triton import ce_forward_grad_

        logits_NV = x_ND @ w_VD.t()
        loss_N = ce_forward_grad_(logits_NV, target_N, ignore_index)  # logits_NV now holds softmax - onehot
        ctx.save_for_backward(x_ND, w_VD, logits_NV)
        return loss_N

    @staticmethod
    def backward(ctx, g_N: torch.Tensor):
        from kernels.cross_entropy.ce_triton import scale_rows

        x_ND, w_VD, d_NV = ctx.saved_tensors
        g = g_N.float().contiguous()
        # the rows' scalings: fp32 products rounded once to x's dtype, one pass each
        dx = None
        if ctx.needs_input_grad[0]:
            dx = d_NV @ w_VD
            scale_rows(dx, g, out=dx)
        dw = d_NV.t() @ scale_rows(x_ND.contiguous(), g) if ctx.needs_input_grad[1] else None
        return dx, dw, None, None


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                         reduction: str = "mean", backend: str | None = None) -> torch.Tensor:
    """``cross_entropy(F.linear(x, weight), target)`` without returning the logits: x ``[..., D]`` (fp32 / bf16 /
    fp16; fp64 always takes the PyTorch path), weight ``[V, D]`` of x's dtype, target ``x.shape[:-1]`` (class ids or
    ``ignore_index``). fp32 result: per row (``"none"``), sum or mean over the non-ignored rows. Differentiable in x
    and weight. Backend as :func:`kernels.cross_entropy.cross_entropy` (the PyTorch path is ``F.linear`` then
    ``cross_entropy_torch``)."""
    fn = "linear_cross_entropy"
    if x.dim() < 2 or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        fail(fn, f"x must be [..., D] and weight [V, D], got x {tuple(x.shape)} and weight {tuple(weight.shape)}")
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        fail(fn, f"x and weight must share a dtype among float32, bfloat16, float16, float64, got {x.dtype} and "
             f"{weight.dtype}")
    if tuple(target.shape) != tuple(x.shape[:-1]) or target.is_floating_point() or target.dtype == torch.bool:
        fail(fn, f"target must be an integer tensor of shape x.shape[:-1] = {tuple(x.shape[:-1])}, got "
             f"{target.dtype} {tuple(target.shape)}")
    if target.device != x.device or weight.device != x.device:
        fail(fn, f"x, weight and target must be on one device, got {x.device}, {weight.device}, {target.device}")
    if reduction not in REDUCTIONS:
        fail(fn, f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if resolve_backend(backend, x.device, fn) != "triton" or x.dtype == torch.float64:  # fp64: the PyTorch path
        return cross_entropy_torch(F.linear(x, weight), target, ignore_index, reduction)
    from kernels.cross_entropy.ce_triton import reduce_rows

    target_N = target.reshape(-1).contiguous()
    loss_N = LinearCrossEntropyFunction.apply(x.reshape(-1, x.shape[-1]), weight, target_N, ignore_index)
    return reduce_rows(loss_N, target, ignore_index, reduction)
