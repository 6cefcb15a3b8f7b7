"""Fused Triton rotate-half RoPE of q and k together, forward and backward (GPU; also under ``TRITON_INTERPRET=1``).

One launch rotates both q and k (each ``[P, H, D]``, any strides with a contiguous last dim, e.g. the strided
views of a fused q|k|v projection, read in place) and writes them contiguous in their dtype. The maths is that of
``rope_torch.py`` in fp32: with halves ``x1 = x[:D/2]``, ``x2 = x[D/2:]`` and the same for ``cos = (c1, c2)`` and
``sin = (s1, s2)``,

    forward   o1 = x1 c1 - x2 s1        o2 = x2 c2 + x1 s2
    backward  d1 = g1 c1 + g2 s2        d2 = g2 c2 - g1 s1        (the transpose: a rotation by -angle)

each product rounded on its own, as PyTorch's separate ops round them: the launches pass ``enable_fp_fusion=False``
so that no multiply-add is contracted into an FMA, which makes the output bit-identical to the reference.

Grid: ``(cdiv(P, BLOCK_P), H)``; a program loads one ``[BLOCK_P, D/2]`` tile of each half of cos and sin and
rotates that tile of one head of q and of k. Fixed configuration (no autotuning): ``BLOCK_P * BLOCK_HALF = 2048``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE_ELEMS = 2048
NUM_WARPS = 4


@triton.jit
def _rotate_tile(x_ptr, o_ptr, rows, cols, mask, stride_p, stride_h, head, HALF: tl.constexpr, c1, c2, u1, u2,
                 H):
    """``o1 = x1 c1 + x2 u1``, ``o2 = x2 c2 + x1 u2`` for one ``[BLOCK_P, BLOCK_HALF]`` tile of one head."""
    src = x_ptr + rows[:, None] * stride_p + head * stride_h + cols[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = o_ptr + rows[:, None] * (H * 2 * HALF) + head * (2 * HALF) + cols[None, :]
    tl.store(dst, (x1 * c1 + x2 * u1).to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * c2 + x1 * u2).to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, P, H, stride_qp, stride_qh, stride_kp, stride_kh,
                 stride_cp, HALF: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 BACKWARD: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    head = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (rows < P)[:, None] & (cols < HALF)[None, :]
    table = rows[:, None] * stride_cp + cols[None, :]
    c1 = tl.load(cos_ptr + table, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + table + HALF, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + table, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + table + HALF, mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:
        u1, u2 = s2, -s1
    else:
        u1, u2 = -s1, s2
    _rotate_tile(q_ptr, qo_ptr, rows, cols, mask, stride_qp, stride_qh, head, HALF, c1, c2, u1, u2, H)
    _rotate_tile(k_ptr, ko_ptr, rows, cols, mask, stride_kp, stride_kh, head, HALF, c1, c2, u1, u2, H)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` with a unit last stride (a copy only when it has none)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _empty_like_rows(x: torch.Tensor) -> torch.Tensor:
    """A contiguous output of x's shape and dtype (its own function so tests can poison it with NaN)."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def rope_qk(q_PHD: torch.Tensor, k_PHD: torch.Tensor, cos_PD: torch.Tensor, sin_PD: torch.Tensor,
            backward: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate (``backward``: rotate back) q and k ``[P, H, D]`` in one launch; contiguous outputs, inputs' dtypes."""
    q, k, cos, sin = _rows(q_PHD), _rows(k_PHD), _rows(cos_PD), _rows(sin_PD)
    if cos.stride() != sin.stride():  # the kernel walks both tables with one row stride
        cos, sin = cos.contiguous(), sin.contiguous()
    P, H, D = q.shape
    q_out, k_out = _empty_like_rows(q), _empty_like_rows(k)
    half = D // 2
    block_half = triton.next_power_of_2(half)
    block_p = max(1, TILE_ELEMS // block_half)
    if P and H:
        _rope_kernel[(triton.cdiv(P, block_p), H)](
            q, k, cos, sin, q_out, k_out, P, H, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0),
            HALF=half, BLOCK_P=block_p, BLOCK_HALF=block_half, BACKWARD=backward, num_warps=NUM_WARPS,
            enable_fp_fusion=False)
    return q_out, k_out


class RopeQKFunction(torch.autograd.Function):
    """``(rope(q), rope(k))`` for q, k ``[P, H, D]`` and fp32 ``cos/sin [P, D]`` (no gradient for cos/sin)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return rope_qk(q, k, cos, sin)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq, dk = rope_qk(dq, dk, cos, sin, backward=True)
        return dq, dk, None, None
