"""Muon update maths as pure functions (Moonlight / Kimi K2 form of Muon).

Source: REFERENCE.md section 4 (Jordan et al. "Muon"; Liu et al. "Muon is Scalable for LLM Training").

    M_t = mu M_{t-1} + G_t                 Nesterov: U = G_t + mu M_t, else U = M_t
    O_t = NS5(U)                           quintic Newton-Schulz, (a, b, c) = (3.4445, -4.7750, 2.0315)
    W_t = W_{t-1} (1 - lr wd) - lr * 0.2 * sqrt(max(A, B)) * O_t

Shapes: a matrix is ``[A, B]`` (rows = output features); a batch of same-shape matrices ``[N, A, B]``.
Tall matrices (A > B) are transposed so the Gram matrix ``X X^T`` is the small ``[min, min]`` one.
"""

from __future__ import annotations

import math

import torch

NS_COEFFS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def momentum_update_(buf: torch.Tensor, grad: torch.Tensor, mu: float, nesterov: bool) -> torch.Tensor:
    """``buf <- mu buf + grad`` in place; return the update direction (``grad + mu buf`` with Nesterov)."""
    buf.mul_(mu).add_(grad)
    return grad.add(buf, alpha=mu) if nesterov else buf


def newton_schulz5(
    G_NAB: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.bfloat16, eps: float = NS_EPS
) -> torch.Tensor:
    """Approximate ``U V^T`` of each matrix (its orthogonal polar factor) with the quintic iteration.

    Args:
        G_NAB: ``[A, B]`` or ``[N, A, B]`` (a batch of same-shape matrices, one 3-D matmul per product).
        steps: iterations (5 in Muon).
        dtype: compute dtype of the iteration (bf16 in Muon; fp32 for exact distributed comparisons).
    Returns:
        same shape as the input, in ``dtype``; singular values land in about [0.7, 1.2].
    """
    if G_NAB.dim() not in (2, 3):
        raise ValueError(f"kimi_vl/optim/muon.py newton_schulz5: G must be [A,B] or [N,A,B], got {tuple(G_NAB.shape)}")
    squeeze = G_NAB.dim() == 2
    X = G_NAB.unsqueeze(0) if squeeze else G_NAB
    tall = X.shape[-2] > X.shape[-1]
    if tall:
        X = X.mT
    # normalise in fp32 so the Frobenius norm of a bf16 input does not lose precision; the division writes
    # straight into ``dtype`` (one rounding, same bits as dividing in fp32 and casting afterwards)
    Xf = X.float()
    norm_N11 = Xf.norm(dim=(-2, -1), keepdim=True)
    X = torch.div(Xf, norm_N11 + eps, out=torch.empty_like(Xf, dtype=dtype))
    X = ns_iterate(X.mT if tall else X, steps)
    return X.squeeze(0) if squeeze else X


def ns_iterate(X_NAB: torch.Tensor, steps: int, natural_layout: bool = False, copy_free: bool = False) -> torch.Tensor:
    """The quintic iterations on an already normalised batch ``[N, A, B]`` (in its compute dtype).

    Tall matrices are iterated as their transposes (small Gram matrix). The result is ``[N, A, B]``; for tall
    inputs it is a transposed view unless ``natural_layout``, where the last step computes ``(Q X)^T`` as
    ``X^T Q^T`` so the result is contiguous ``[N, A, B]`` (same maths, other rounding order).

    ``copy_free``: ``torch.baddbmm`` with ``beta != 0`` first copies its ``input`` into the output (a separate
    memory pass of X's size every step); instead ``Q = b A + c A A`` gets ``a`` added to its diagonal and
    ``X <- Q X`` is a plain ``bmm``. Same polynomial; the diagonal of ``Q`` is rounded once more (bf16).
    """
    X = X_NAB
    tall = X.shape[-2] > X.shape[-1]
    if tall:
        X = X.mT
    a, b, c = NS_COEFFS
    for i in range(steps):
        A_NAA = torch.bmm(X, X.mT)
        B_NAA = torch.baddbmm(A_NAA, A_NAA, A_NAA, beta=b, alpha=c)  # b A + c A A
        last_natural = tall and natural_layout and i == steps - 1
        if copy_free:
            diag_NA = B_NAA.diagonal(dim1=-2, dim2=-1)
            diag_NA.copy_(diag_NA.float() + a)  # Q = a I + b A + c A A (in fp32: a bf16 ``a`` would bias the diagonal)
            if last_natural:
                return torch.bmm(X.mT, B_NAA.mT)  # (Q X)^T
            X = torch.bmm(B_NAA, X)
            continue
        if last_natural:
            return torch.baddbmm(X.mT, X.mT, B_NAA.mT, beta=a)  # (a X + B X)^T = a X^T + X^T B^T
        X = torch.baddbmm(X, B_NAA, X, beta=a)  # a X + B X
    return X.mT if tall else X


def newton_schulz5_reference(G: torch.Tensor, steps: int = 5, eps: float = NS_EPS) -> torch.Tensor:
    """The same polynomial in fp64, one matrix at a time, written plainly: the oracle for :func:`newton_schulz5`."""
    X = G.double()
    tall = X.shape[-2] > X.shape[-1]
    if tall:
        X = X.mT
    X = X / (torch.linalg.matrix_norm(X, keepdim=True) + eps)
    a, b, c = NS_COEFFS
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X.mT if tall else X


def rms_match_scale(rows: int, cols: int) -> float:
    """``0.2 * sqrt(max(A, B))``: gives an orthogonal update RMS 0.2, like AdamW's, so both share lr and wd."""
    return 0.2 * math.sqrt(max(rows, cols))


def measured_rms_correction(O_NAB: torch.Tensor, target_rms: float = 0.2) -> torch.Tensor:
    """Per-matrix factor ``c`` with ``RMS(c * rms_match_scale(A, B) * O) == target_rms`` exactly.

    The quintic's singular values spread over ~[0.68, 1.13], so the shape-only factor gives an update RMS
    of ~0.16-0.19 rather than 0.2; multiplying by ``c`` (fp32 ``[N, 1, 1]``) measures instead of assuming.
    """
    A, B = O_NAB.shape[-2:]
    rms_N11 = O_NAB.float().pow(2).mean(dim=(-2, -1), keepdim=True).sqrt()
    return target_rms / (rms_match_scale(A, B) * rms_N11.clamp_min(1e-12))


def decoupled_weight_decay_(param: torch.Tensor, lr: float, weight_decay: float) -> None:
    """``W <- W (1 - lr wd)`` (decay uses the unscaled learning rate)."""
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)


def apply_muon_update_(param: torch.Tensor, ortho: torch.Tensor, lr: float, weight_decay: float, scale: float) -> None:
    """``W <- W (1 - lr wd) - lr * scale * O`` with ``O`` cast to the parameter dtype."""
    decoupled_weight_decay_(param, lr, weight_decay)
    param.add_(ortho.to(param.dtype), alpha=-lr * scale)
