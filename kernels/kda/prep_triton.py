"""Triton L2 norm and KDA gate, forward and backward (``../shared/REFERENCE.md`` section 1).

The reference is ``kernels/kda/naive.py``: :func:`l2norm_ref` (``x / sqrt(sum x^2 + 1e-6)`` over the head dim,
computed in fp32 and cast back to the input dtype, as fla does) and :func:`kda_gate_ref` (the softplus
"unbounded" gate ``-exp(A_log) softplus(x)`` and the lower-bound gate ``lb sigmoid(exp(A_log) x)``, with
``x = g_raw + dt_bias``; the log-decay comes back in fp32). Before these kernels the training path ran both as
chains of PyTorch fp32 elementwise ops (about ten passes over ``[B, T, H, K]``); here each is one pass forward
and one backward:

- ``_l2_fwd_kernel`` / ``_l2_bwd_kernel``, rows of ``[M, D]``: y = x r with r = 1 / sqrt(sum x^2 + eps) saved
  (fp32 ``[M]``); ``dx = r (dy - y sum(dy y))`` with y recomputed in fp32 from x and r (or r formed again from x,
  ``R_FROM_X``: the KDA training backward, whose saved norms are in the chunk layout). x is read in place with
  a token stride (:func:`token_rows`: q and k are views of the layer's q|k|v tensor), y and dx are contiguous
  (:func:`qkv_l2_grad`: dq, dk written into one q|k|v gradient at the views' offsets).
- ``_gate_fwd_kernel`` / ``_gate_bwd_kernel``, per (block of BT tokens, value head): the gate, and its backward
  ``d g_raw = dg dG/dx``; ``dA_log`` and ``d dt_bias`` are per-program partial sums over the block's tokens
  (``[NB, HV]``, ``[NB, HV, K]`` fp32) reduced afterwards by ``torch.sum`` (deterministic, no atomics).

The KDA op's training path (``chunk_triton.ChunkKDAFunction``) normalises and gates inside its forward's prep
kernel and uses these kernels only in its backward, without autograd: :func:`qkv_l2_grad` / :func:`l2norm_bwd`
(with ``r`` None: the inverse norms formed again from x in the same pass), and, with ``BWD_FUSED_L2`` /
``BWD_FUSED_GATE`` off, :func:`l2norm_fwd`, :func:`gate_fwd` / :func:`gate_bwd` (on, the core backward's inter
kernel takes the gate's backward through :func:`_gate_grad`); the autograd functions here are the same maths as
standalone differentiable ops.

Fixed configurations (no autotune), so all four run under ``TRITON_INTERPRET=1`` on a CPU.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.colsum import column_sum

EPS = 1e-6
ELEMS = 4096  # elements per program: rows per program = ELEMS // next_pow2(D)
# Session 33 (H200, call4, sweep_kda_bwd at the small hybrid's 8x4096x6) tried the gate backward's program walking
# 4 / 8 / 16 such blocks with its partial sums reduced once: backward 1.848 / 1.843 / 1.863 ms against 1.828 at one
# block (the hybrid's step: gate backward 0.75 -> 1.16 ms at 8); removed.


@triton.jit
def _gate(x, a_log, lb, LOWER: tl.constexpr):
    """fp32 gate: lower-bound sigmoid form or -exp(A_log) * softplus (identity above 20)."""
    a = tl.exp(a_log)
    if LOWER:
        return lb * tl.sigmoid(a * x)
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    return -a * sp


@triton.jit
def _gate_grad(x, dg, a, lb, LOWER: tl.constexpr):
    """``(d x, d A_log)`` elementwise (fp32) of :func:`_gate` at ``x = g_raw + dt_bias``, ``a = exp(A_log)``, for the
    upstream gradient ``dg`` of the log-decay."""
    if LOWER:
        s = tl.sigmoid(a * x)
        ds = dg * (lb * s * (1.0 - s))  # dG / d(a x)
        return ds * a, ds * a * x
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    return dg * (-a) * tl.where(x > 20.0, 1.0, tl.sigmoid(x)), dg * (-a) * sp  # dG / dA_log = G


@triton.jit
def _l2_fwd_kernel(x_ptr, y_ptr, r_ptr, M, XS, HX, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, eps):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BD)
    m = (rows < M)[:, None] & (cols < D)[None, :]
    off = rows[:, None] * D + cols[None, :]
    x_off = ((rows // HX) * XS + (rows % HX) * D)[:, None] + cols[None, :]
    x = tl.load(x_ptr + x_off, mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, 1) + eps)
    tl.store(y_ptr + off, (x * r[:, None]).to(y_ptr.dtype.element_ty), mask=m)
    tl.store(r_ptr + rows, r, mask=rows < M)


@triton.jit
def _l2_bwd_kernel(x_ptr, r_ptr, dy_ptr, dx_ptr, M, XS, HX, eps, D: tl.constexpr, BD: tl.constexpr,
                   BM: tl.constexpr, DX_AS_X: tl.constexpr, R_FROM_X: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BD)
    m = (rows < M)[:, None] & (cols < D)[None, :]
    off = rows[:, None] * D + cols[None, :]
    x_off = ((rows // HX) * XS + (rows % HX) * D)[:, None] + cols[None, :]
    x = tl.load(x_ptr + x_off, mask=m, other=0.0).to(tl.float32)
    if R_FROM_X:  # the inverse norms from the row itself (no saved r; the forward's formula)
        r = 1.0 / tl.sqrt(tl.sum(x * x, 1) + eps)
    else:
        r = tl.load(r_ptr + rows, mask=rows < M, other=0.0)
    y = x * r[:, None]
    dy = tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32)
    dx = r[:, None] * (dy - y * tl.sum(dy * y, 1)[:, None])
    tl.store(dx_ptr + (x_off if DX_AS_X else off), dx.to(dx_ptr.dtype.element_ty), mask=m)


def token_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x [B, T, H, D]`` and its token stride: read in place when each token's ``H x D`` block is contiguous and B, T
    merge into one stride (q, k, v as views of the KDA layer's ``[B, T, 3 H D]`` q|k|v conv output), else a
    contiguous copy with stride ``H D``."""
    H, D = x.shape[-2], x.shape[-1]
    if x.stride(-1) == 1 and x.stride(-2) == D and (x.shape[0] == 1 or x.stride(0) == x.shape[1] * x.stride(1)):
        return x, x.stride(1)
    return x.contiguous(), H * D


def qk_rows(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """q, k ``[B, T, H, K]`` as the KDA kernels read them, with their common token stride: in place when
    :func:`token_rows` gives both the same stride (views of the KDA layer's q|k|v tensor), else contiguous."""
    (qc, qs), (kc, ks) = token_rows(q), token_rows(k)
    if qs != ks:
        return q.contiguous(), k.contiguous(), q.shape[2] * q.shape[3]
    return qc, kc, qs


def _rows(D: int) -> tuple[int, int]:
    BD = triton.next_power_of_2(max(D, 1))
    return BD, max(1, ELEMS // BD)


def _l2_fwd(x: torch.Tensor, shape: tuple[int, ...], xs: int, hx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, r)``: rows of ``x`` (``hx`` rows of D per token, tokens ``xs`` elements apart) normalised into a new
    contiguous ``y`` of ``shape`` (x's dtype), and their fp32 inverse norms ``r [M]``."""
    D = shape[-1]
    M = math.prod(shape) // max(D, 1)
    y = torch.empty(shape, dtype=x.dtype, device=x.device)
    r = torch.empty(M, dtype=torch.float32, device=x.device)
    BD, BM = _rows(D)
    if M:
        _l2_fwd_kernel[(triton.cdiv(M, BM),)](x, y, r, M, xs, hx, D=D, BD=BD, BM=BM, eps=EPS, num_warps=4)
    return y, r


def _l2_bwd(x: torch.Tensor, r: torch.Tensor | None, dy: torch.Tensor, dx: torch.Tensor, xs: int, hx: int, D: int,
            dx_as_x: bool) -> None:
    """``dx = r (dy - y sum(dy y))`` for the rows of ``x`` laid out as in :func:`_l2_fwd` (y recomputed from x and
    r; ``r`` None: r too, from x, as the forward forms it); dx written at x's offsets (``dx_as_x``, into a tensor
    shaped like x's storage) or contiguously. The rows are dy's (``[..., D]``, one per row of x)."""
    M = dy.numel() // max(D, 1)
    BD, BM = _rows(D)
    if M:
        _l2_bwd_kernel[(triton.cdiv(M, BM),)](x, x if r is None else r, dy.contiguous(), dx, M, xs, hx, EPS, D=D,
                                              BD=BD, BM=BM, DX_AS_X=dx_as_x, R_FROM_X=r is None, num_warps=4)


def l2_rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """``(xc, xs, hx)``: the tensor the L2 kernels read for ``x [..., D]`` (x itself when it is a ``[B, T, H, D]``
    view whose token rows allow, :func:`token_rows`), its token stride and its rows per token."""
    if x.dim() == 4:  # [B, T, H, D], possibly a view with a wider token stride: read in place
        xc, xs = token_rows(x)
        return xc, xs, x.shape[2]
    return x.contiguous(), x.shape[-1], 1


def l2norm_fwd(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(l2norm(x) in x's dtype, fp32 1/norm per row)`` without autograd (the KDA op's backward recomputes q, k)."""
    xc, xs, hx = l2_rows(x)
    return _l2_fwd(xc, x.shape, xs, hx)


def l2norm_bwd(x: torch.Tensor, r: torch.Tensor | None, dy: torch.Tensor) -> torch.Tensor:
    """dx of :func:`l2norm_fwd` for the upstream gradient dy (contiguous, x's shape and dtype); ``r`` None: the
    inverse norms are formed again from x in the same pass."""
    xc, xs, hx = l2_rows(x)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _l2_bwd(xc, r, dy, dx, xs, hx, x.shape[-1], False)
    return dx


class L2NormFunction(torch.autograd.Function):
    """``l2norm_ref(x.float()).to(x.dtype)`` over the last dim in one Triton pass; saves x and fp32 1/norm."""

    @staticmethod
    def forward(ctx, x):
        y, r = l2norm_fwd(x)
        ctx.save_for_backward(x, r)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, r = ctx.saved_tensors
        return l2norm_bwd(x, r, dy)


def l2norm_triton(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] -> x / sqrt(sum x^2 + 1e-6) in x's dtype (fp32 math), differentiable."""
    return L2NormFunction.apply(x)


def qkv_base(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """The contiguous ``[B, T, 3 H D]`` tensor whose last dim q, k, v ``[B, T, H, D]`` are the thirds of, in that
    order (the KDA layer's q|k|v conv output, split by ``chunk(3)``), else None. The views' common base must be that
    tensor itself and, when they need a gradient, part of the autograd graph (a tensor made inside a custom
    function's forward and returned as a view is not: gradients through it would be lost)."""
    base = q._base
    if base is None or k._base is not base or v._base is not base or not base.is_contiguous():
        return None
    if any(x.requires_grad for x in (q, k, v)) and not base.requires_grad:
        return None
    B, T, H, D = q.shape
    if base.shape != (B, T, 3 * H * D) or k.shape != q.shape or v.shape != q.shape:
        return None
    strides = (T * 3 * H * D, 3 * H * D, D, 1)
    offsets = [x.storage_offset() - base.storage_offset() for x in (q, k, v)]
    if offsets != [0, H * D, 2 * H * D] or any(x.stride() != strides for x in (q, k, v)):
        return None
    return base


def qkv_l2_grad(qkv: torch.Tensor, H: int, D: int, q_part, k_part, dv: torch.Tensor | None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """d(qkv) ``[B, T, 3 H D]`` (``out``, else a new tensor), for q, k, v the thirds of ``qkv`` (:func:`qkv_base`)
    with q and k L2-normalised: each of ``q_part``, ``k_part`` is ``(dy, r)`` (upstream gradient, the fp32 inverse
    norms of :func:`l2norm_fwd` or None to form them from x again), its L2 backward written at that third's offsets;
    ``dv`` copied into the v third (``None``: already there, written by the KDA backward through
    :func:`qkv_dv_view`). Separate gradients of the ``chunk(3)`` views would leave autograd to concatenate them, a
    pass over the whole tensor (~0.3 ms a KDA layer at 98k tokens x 2304 channels on an H100, session 13's trace)."""
    B, T, _ = qkv.shape
    HD = H * D
    dqkv = torch.empty_like(qkv) if out is None else out
    for i, (dy, r) in enumerate((q_part, k_part)):
        _l2_bwd(qkv[..., i * HD:], r, dy, dqkv[..., i * HD:], 3 * HD, H, D, True)
    if dv is not None:
        dqkv[..., 2 * HD:].copy_(dv.reshape(B, T, HD))
    return dqkv


def qkv_dv_view(dqkv: torch.Tensor, H: int, D: int) -> torch.Tensor:
    """The v third of a q|k|v gradient ``[B, T, 3 H D]`` as ``[B, T, H, D]`` (a view): where the KDA backward writes
    dv directly (session 29: the copy into it was 9 strided-copy kernels, ~0.45 ms a step of the small hybrid)."""
    return dqkv[..., 2 * H * D:].unflatten(-1, (H, D))


@triton.jit
def _gate_fwd_kernel(
    x_ptr,
    alog_ptr,
    dtb_ptr,
    g_ptr,
    lb,
    M,
    HV: tl.constexpr,
    K: tl.constexpr,
    BK: tl.constexpr,
    BT: tl.constexpr,
    LOWER: tl.constexpr,
    HAS_DTB: tl.constexpr,
):
    i_t = tl.program_id(0)
    i_hv = tl.program_id(1)
    rows = i_t.to(tl.int64) * BT + tl.arange(0, BT)
    ck = tl.arange(0, BK)
    cm = ck < K
    m = (rows < M)[:, None] & cm[None, :]
    off = rows[:, None] * (HV * K) + i_hv * K + ck[None, :]
    x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    if HAS_DTB:
        x += tl.load(dtb_ptr + i_hv * K + ck, mask=cm, other=0.0).to(tl.float32)[None, :]
    a_log = tl.load(alog_ptr + i_hv).to(tl.float32)
    tl.store(g_ptr + off, _gate(x, a_log, lb, LOWER), mask=m)


@triton.jit
def _gate_bwd_kernel(
    x_ptr,
    alog_ptr,
    dtb_ptr,
    dg_ptr,
    dx_ptr,
    pa_ptr,
    pb_ptr,
    lb,
    M,
    HV: tl.constexpr,
    K: tl.constexpr,
    BK: tl.constexpr,
    BT: tl.constexpr,
    LOWER: tl.constexpr,
    HAS_DTB: tl.constexpr,
):
    """d g_raw = dg dG/dx; partial sums over this block's tokens of dA_log (``pa [NB, HV]``) and of
    d dt_bias = d g_raw (``pb [NB, HV, K]``)."""
    i_t = tl.program_id(0)
    i_hv = tl.program_id(1)
    rows = i_t.to(tl.int64) * BT + tl.arange(0, BT)
    ck = tl.arange(0, BK)
    cm = ck < K
    m = (rows < M)[:, None] & cm[None, :]
    off = rows[:, None] * (HV * K) + i_hv * K + ck[None, :]
    x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    if HAS_DTB:
        x += tl.load(dtb_ptr + i_hv * K + ck, mask=cm, other=0.0).to(tl.float32)[None, :]
    dg = tl.load(dg_ptr + off, mask=m, other=0.0).to(tl.float32)
    dx, da = _gate_grad(x, dg, tl.exp(tl.load(alog_ptr + i_hv).to(tl.float32)), lb, LOWER)
    dx = tl.where(m, dx, 0.0)
    da = tl.where(m, da, 0.0)
    tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=m)
    tl.store(pa_ptr + i_t * HV + i_hv, tl.sum(tl.sum(da, 1), 0))
    tl.store(pb_ptr + (i_t * HV + i_hv) * K + ck, tl.sum(dx, 0), mask=cm)


def _gate_cfg(K: int) -> tuple[int, int]:
    BK = triton.next_power_of_2(max(K, 1))
    return BK, max(1, ELEMS // BK)


def _gate_args(x: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None, lower_bound: float | None):
    """``(xc, A_log, dtb, lb, M, grid, kw)`` of a gate kernel launch over ``x [..., HV, K]``."""
    HV, K = x.shape[-2], x.shape[-1]
    xc = x.contiguous()
    M = xc.numel() // max(HV * K, 1)
    BK, BT = _gate_cfg(K)
    has_dtb = dt_bias is not None
    dtb = dt_bias.contiguous() if has_dtb else A_log
    lb = float(lower_bound) if lower_bound is not None else 0.0
    kw = dict(HV=HV, K=K, BK=BK, BT=BT, LOWER=lower_bound is not None, HAS_DTB=has_dtb, num_warps=4)
    return xc, A_log.contiguous(), dtb, lb, M, (triton.cdiv(M, BT), HV), kw


def gate_fwd(x: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None,
             lower_bound: float | None) -> torch.Tensor:
    """``kda_gate_ref(x, A_log, dt_bias, lower_bound)`` (fp32 ``[..., HV, K]``) without autograd."""
    xc, a_log, dtb, lb, M, grid, kw = _gate_args(x, A_log, dt_bias, lower_bound)
    g = torch.empty(xc.shape, dtype=torch.float32, device=x.device)
    if M:
        _gate_fwd_kernel[grid](xc, a_log, dtb, g, lb, M, **kw)
    return g


def gate_bwd(x: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None, lower_bound: float | None,
             dg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(d x, d A_log, d dt_bias or None)`` of :func:`gate_fwd` for the upstream gradient ``dg`` (deterministic
    two-stage reductions: per-program partial sums, then ``kernels.colsum.column_sum``)."""
    xc, a_log, dtb, lb, M, grid, kw = _gate_args(x, A_log, dt_bias, lower_bound)
    nb, HV, K = grid[0], kw["HV"], kw["K"]
    dx = torch.empty_like(xc)
    alloc = torch.empty if M else torch.zeros  # every program writes its entries; no rows: no programs
    pa = alloc(max(nb, 1), HV, dtype=torch.float32, device=xc.device)
    pb = alloc(max(nb, 1), HV, K, dtype=torch.float32, device=xc.device)
    if M:
        _gate_bwd_kernel[grid](xc, a_log, dtb, dg.contiguous(), dx, pa, pb, lb, M, **kw)
    return (dx, *gate_param_grads(pa, pb, A_log, dt_bias))


def gate_param_grads(pa: torch.Tensor, pb: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(d A_log, d dt_bias or None)`` from the gate backward's fp32 per-program partial sums ``pa [P, HV]`` and
    ``pb [P, HV, K]`` (deterministic: ``kernels.colsum.column_sum``), in the parameters' dtypes and shapes."""
    dA = column_sum(pa, A_log.dtype).reshape(A_log.shape)
    return dA, column_sum(pb, dt_bias.dtype).reshape(dt_bias.shape) if dt_bias is not None else None


class KDAGateFunction(torch.autograd.Function):
    """``kda_gate_ref(g_raw, A_log, dt_bias, lower_bound)``: g_raw [B, T, HV, K] -> fp32 log-decay; gradients
    for g_raw, A_log [HV] and dt_bias [HV * K] (deterministic two-stage reductions)."""

    @staticmethod
    def forward(ctx, x, A_log, dt_bias, lower_bound):
        ctx.save_for_backward(x, A_log, dt_bias)
        ctx.lower_bound = lower_bound
        return gate_fwd(x, A_log, dt_bias, lower_bound)

    @staticmethod
    def backward(ctx, dg):
        x, A_log, dt_bias = ctx.saved_tensors
        return (*gate_bwd(x, A_log, dt_bias, ctx.lower_bound, dg), None)


def kda_gate_triton(
    g_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None, lower_bound: float | None
) -> torch.Tensor:
    """g_raw [B, T, HV, K] -> fp32 log-decay [B, T, HV, K] (see :func:`kernels.kda.naive.kda_gate_ref`),
    differentiable in g_raw, A_log [HV] and dt_bias [HV * K]."""
    return KDAGateFunction.apply(g_raw, A_log, dt_bias, lower_bound)
