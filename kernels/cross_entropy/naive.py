"""PyTorch cross entropy in fp32: the reference of the Triton kernels and the CPU path.

Exactly the loss the model used before the fused kernel: ``F.cross_entropy`` on an fp32 copy of the logits,
so CPU numerics are bit-for-bit those of ``F.cross_entropy(logits.float(), ...)``. The gradient reaches
bf16/fp16 logits through the cast's backward (the fp32 gradient rounded to the logits' dtype).

Shapes: logits ``[N, V]`` or ``[B, T, V]``; target of shape ``logits.shape[:-1]``; the ``"none"`` loss has
the target's shape, fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy_torch(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                        reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy(logits.float(), target)`` over the flattened rows; fp32 loss."""
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.float().reshape(-1, V), target.reshape(-1).long(), ignore_index=ignore_index,
                           reduction=reduction)
    return loss.view(target.shape) if reduction == "none" else loss
