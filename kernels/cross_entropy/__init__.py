"""Cross entropy on fp32 / bf16 / fp16 logits without an fp32 copy of them (a fused Triton forward/backward).

    loss_n = logsumexp_v(logits[n, v]) - logits[n, target_n]      (0 where target_n == ignore_index)

Two implementations behind one dispatch point: ``naive.py`` (``F.cross_entropy`` on ``logits.float()``, the
reference and the CPU path, bit-identical to what the model used before) and ``ce_triton.py`` (a forward that
streams each row once and saves only the fp32 log-sum-exp, a backward that recomputes the softmax and writes the
gradient in the logits' dtype). The ``backend`` argument, else ``KVL_CE_BACKEND=triton|torch``, else Triton on
CUDA and PyTorch elsewhere; ``KVL_CE_BACKEND=triton TRITON_INTERPRET=1`` runs the Triton kernels on a CPU.

``linear_cross_entropy(x, weight, target)`` (``linear_ce.py``) is the LM head and this loss as one node that never
returns the logits (on the Triton path one logits-sized buffer fewer, and one read of them fewer up to 32768
classes, where its kernel holds a whole row in registers).

Shapes: logits ``[N, V]`` or ``[B, T, V]`` (unit stride along V, any row strides: ``logits_BLV[:, :-1]`` is
read in place by the Triton path); target ``[N]`` / ``[B, T]``; the ``"none"`` loss has the target's shape.

Example::

    import torch
    from kernels.cross_entropy import cross_entropy
    logits = torch.randn(2, 5, 11, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 11, (2, 5)); target[0, 0] = -100
    loss = cross_entropy(logits, target)                      # fp32 scalar, mean over 9 targets
    loss.backward()                                           # logits.grad: bf16 [2, 5, 11]
    per_row = cross_entropy(logits, target, reduction="none")  # fp32 [2, 5], 0 at [0, 0]
"""

from __future__ import annotations

import torch

from kernels.cross_entropy.api import check_inputs, resolve_backend
from kernels.cross_entropy.linear_ce import linear_cross_entropy
from kernels.cross_entropy.naive import cross_entropy_torch

__all__ = ["cross_entropy", "cross_entropy_torch", "linear_cross_entropy"]


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, reduction: str = "mean",
                  backend: str | None = None, inplace_backward: bool = False) -> torch.Tensor:
    """Cross entropy of logits ``[N, V]`` / ``[B, T, V]`` (fp32, bf16 or fp16) against target ``[N]`` / ``[B, T]``.

    Returns fp32: per row (``reduction="none"``, target's shape, 0 on ignored rows), their sum, or their mean
    over the rows whose target is not ``ignore_index`` (NaN when there is none, like ``F.cross_entropy``).
    Differentiable in ``logits``; the gradient has the logits' dtype. Targets must lie in ``[0, V)`` or equal
    ``ignore_index``: this is not checked on the host (it would synchronise); the PyTorch path raises or
    device-asserts on a bad target, the Triton path gives that row a NaN loss. ``inplace_backward=True``
    (Triton path only) writes the gradient into the logits' storage to save one logits-sized buffer; only
    when nothing else uses the logits after the backward.
    """
    check_inputs("cross_entropy", logits, target, reduction)
    if resolve_backend(backend, logits.device, "cross_entropy") == "triton":
        from kernels.cross_entropy.ce_triton import cross_entropy_triton

        return cross_entropy_triton(logits, target, ignore_index, reduction, inplace_backward)
    return cross_entropy_torch(logits, target, ignore_index, reduction)
