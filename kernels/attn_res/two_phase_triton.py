"""Two-phase block Attention-Residual inference in Triton (``../shared/REFERENCE.md`` s. 3; the PyTorch form is
``phase1`` / ``phase2`` in ``kimi_vl/modeling/attn_res.py``, which these kernels must equal).

The block states live in one contiguous buffer ``v [K, M, D]`` (slot 0 the embedding, slot ``k`` the ``k``-th
block's running sum), the pseudo-queries in ``u [Q, D]`` fp32 (``u = w * gain``). Both kernels index them
in-kernel, so a call creates no views and copies nothing: two launches per block plus one per sublayer is all
the mix costs in decode (where ``M = batch`` tokens and launch overhead, not bandwidth, sets the time).

- ``phase1``: for the queries ``q0 .. q0 + S - 1`` of a block and its completed slots ``0 .. N - 1``, per token
  (fp32): ``s_qn = u_q . x_n * rstd(x_n)``, ``m_q = max_n s_qn``, ``l_q = sum_n e^(s_qn - m_q)``,
  ``o_q = sum_n e^(s_qn - m_q) x_n`` (unnormalised). One program per tile of tokens walks the ``S`` queries,
  each over the ``N`` slots with an online softmax; the tile's slots are re-read from L1/L2, not HBM.
- ``phase2``: sublayer ``j`` of the block merges its own partial sum ``p`` (slot ``k``), if any:
  ``s = u . p * rstd(p)``, ``m' = max(m, s)``, ``h = (o e^(m - m') + p e^(s - m')) / (l e^(m - m') + e^(s - m'))``;
  without a partial sum (a block's first sublayer) ``h = o / l``. ``h`` is written in the buffer's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attn_res.mix_triton import NUM_WARPS, _blocks

_WHERE = "kernels/attn_res/two_phase_triton.py"


@triton.jit(do_not_specialize=["n_src", "q0", "n_q", "M"])
def _phase1_kernel(
    v_ptr, u_ptr, o_ptr, m_ptr, l_ptr, n_src, q0, n_q, M, D, eps,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    t_ok = offs_t < M
    d_ok = offs_d < D
    tile_ok = t_ok[:, None] & d_ok[None, :]
    offs = offs_t.to(tl.int64)[:, None] * D + offs_d[None, :]
    slot = M.to(tl.int64) * D
    for q in range(n_q):
        u = tl.load(u_ptr + (q0 + q) * D + offs_d, mask=d_ok, other=0.0)
        m = tl.full([BLOCK_T], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_T], dtype=tl.float32)
        acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for n in range(n_src):
            x = tl.load(v_ptr + n * slot + offs, mask=tile_ok, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
            s = tl.sum(x * u[None, :], axis=1) * rstd
            m_new = tl.maximum(m, s)
            scale = tl.exp(m - m_new)
            p = tl.exp(s - m_new)
            acc = acc * scale[:, None] + p[:, None] * x
            l = l * scale + p
            m = m_new
        tl.store(o_ptr + q * slot + offs, acc, mask=tile_ok)
        tl.store(m_ptr + q * M + offs_t, m, mask=t_ok)
        tl.store(l_ptr + q * M + offs_t, l, mask=t_ok)


@triton.jit(do_not_specialize=["j", "k", "qi", "M"])
def _phase2_kernel(
    o_ptr, m_ptr, l_ptr, j, v_ptr, k, u_ptr, qi, h_ptr, M, D, eps,
    HAS_PARTIAL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    t_ok = offs_t < M
    d_ok = offs_d < D
    tile_ok = t_ok[:, None] & d_ok[None, :]
    offs = offs_t.to(tl.int64)[:, None] * D + offs_d[None, :]
    slot = M.to(tl.int64) * D
    o = tl.load(o_ptr + j * slot + offs, mask=tile_ok, other=0.0)
    m = tl.load(m_ptr + j * M + offs_t, mask=t_ok, other=0.0)
    l = tl.load(l_ptr + j * M + offs_t, mask=t_ok, other=1.0)
    if HAS_PARTIAL:
        u = tl.load(u_ptr + qi * D + offs_d, mask=d_ok, other=0.0)
        p = tl.load(v_ptr + k * slot + offs, mask=tile_ok, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(p * p, axis=1) / D + eps)
        s = tl.sum(p * u[None, :], axis=1) * rstd
        m_new = tl.maximum(m, s)
        a = tl.exp(m - m_new)
        b = tl.exp(s - m_new)
        h = (o * a[:, None] + p * b[:, None]) / (l * a + b)[:, None]
    else:
        h = o / l[:, None]
    tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=tile_ok)


def _check(v_KMD: torch.Tensor, u_QD: torch.Tensor) -> None:
    if v_KMD.dim() != 3 or not v_KMD.is_contiguous():
        raise ValueError(f"{_WHERE}: the block-state buffer must be a contiguous [K, M, D], got "
                         f"{tuple(v_KMD.shape)} (contiguous={v_KMD.is_contiguous()})")
    if u_QD.dtype != torch.float32 or u_QD.dim() != 2 or u_QD.shape[1] != v_KMD.shape[2] \
            or not u_QD.is_contiguous():
        raise ValueError(f"{_WHERE}: queries u must be a contiguous fp32 [Q, D={v_KMD.shape[2]}], got "
                         f"{u_QD.dtype} {tuple(u_QD.shape)}")


def phase1_triton(v_KMD: torch.Tensor, n_src: int, u_QD: torch.Tensor, q0: int, n_q: int, eps: float
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries ``u[q0 : q0 + n_q]`` against slots ``v[:n_src]`` -> fp32 ``o [n_q, M, D]``, ``m, l [n_q, M]``."""
    _check(v_KMD, u_QD)
    if not (1 <= n_src <= v_KMD.shape[0] and n_q >= 1 and 0 <= q0 and q0 + n_q <= u_QD.shape[0]):
        raise ValueError(f"{_WHERE}: phase1 needs 1 <= n_src <= K={v_KMD.shape[0]} and queries inside "
                         f"Q={u_QD.shape[0]}, got n_src={n_src}, q0={q0}, n_q={n_q}")
    _, m, d = v_KMD.shape
    o = torch.empty(n_q, m, d, device=v_KMD.device, dtype=torch.float32)
    ml = torch.empty(2, n_q, m, device=v_KMD.device, dtype=torch.float32)
    block_t, block_d = _blocks(d)
    _phase1_kernel[(triton.cdiv(m, block_t),)](
        v_KMD, u_QD, o, ml[0], ml[1], n_src, q0, n_q, m, d, eps,
        BLOCK_T=block_t, BLOCK_D=block_d, num_warps=NUM_WARPS)
    return o, ml[0], ml[1]


def phase2_triton(o: torch.Tensor, m: torch.Tensor, l: torch.Tensor, j: int, v_KMD: torch.Tensor, k: int | None,
                  u_QD: torch.Tensor, qi: int, eps: float) -> torch.Tensor:
    """Sublayer ``j`` of the block (query ``u[qi]``) merges its partial sum ``v[k]`` (``k=None``: none) with
    phase 1's ``o[j], m[j], l[j]`` -> ``h [M, D]`` in the buffer's dtype."""
    _, mm, d = v_KMD.shape
    h = torch.empty(mm, d, device=v_KMD.device, dtype=v_KMD.dtype)
    block_t, block_d = _blocks(d)
    _phase2_kernel[(triton.cdiv(mm, block_t),)](
        o, m, l, j, v_KMD, 0 if k is None else k, u_QD, qi, h, mm, d, eps,
        HAS_PARTIAL=k is not None, BLOCK_T=block_t, BLOCK_D=block_d, num_warps=NUM_WARPS)
    return h
