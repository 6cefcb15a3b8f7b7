"""Triton kernels of the fused cross entropy on fp32 / bf16 / fp16 logits, and their autograd Function.

Same maths as ``naive.py`` (the reference), per row n with target t_n, without an fp32 copy of the logits:

    lse_n  = log sum_v exp(x[n, v])                 (online max / sum-exp over chunks of V, fp32)
    loss_n = lse_n - x[n, t_n]                      (0 where t_n == ignore_index)
    dx[n, v] = g_n * (exp(x[n, v] - lse_n) - [v == t_n])   (0 where t_n == ignore_index)

with ``g_n`` the incoming gradient of ``loss_n``. Only ``lse`` ([N] fp32) is saved between the passes; the
softmax is recomputed from the logits in the backward, which writes ``dx`` in the logits' dtype directly
(rounded once from fp32, like the reference's cast backward).

Kernels (fixed configurations, so they run under ``TRITON_INTERPRET=1``; no autotuning):
- ``_ce_fwd_kernel``, grid (N,): one program streams its row in ``BLOCK_V`` chunks (a running max ``m`` and
  ``s = sum exp(x - m)`` rescaled when the max grows: one exp per element), then loads the target logit once.
  Rows with ``ignore_index`` read nothing. A target outside ``[0, V)`` (other than ``ignore_index``) is not
  checked on the host (that would synchronise); its load is masked and its loss is NaN.
- ``_ce_bwd_kernel``, grid (N,): one program recomputes its row's softmax chunk by chunk from ``lse`` and writes
  ``dx``; ignored rows get zeros without reading the logits.
- ``_ce_fwd_grad_kernel``, grid (N,): the forward, then the row's gradient for an upstream gradient of 1 written
  over the row (``linear_ce.py``: the LM head's loss when nothing reads the logits, the upstream gradient applied
  to the head's small operands in its backward).

Layout: logits ``[N, V]`` or ``[B, T, V]`` with a unit stride along V and any row strides (a view such as
``logits_BLV[:, :-1]`` is read in place, no copy); rows are flattened as ``n = b * T + t``. A non-unit stride
along V is copied to a contiguous tensor first. ``dx`` is a new contiguous tensor of the logits' shape, or with
``inplace_backward`` the logits' own storage (they must not be needed after the backward).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BLOCK_V = 4096  # 8 KB of bf16 per chunk: 16 elements per thread at 8 warps
FP32_LOWEST = tl.constexpr(-3.4028234663852886e38)  # running-max start: finite, so exp(m - m_new) never sees inf - inf


def _config(V: int) -> tuple[int, int]:
    """(BLOCK_V, num_warps): one chunk covers small vocabularies, 4096-wide chunks otherwise."""
    block = min(MAX_BLOCK_V, triton.next_power_of_2(V))
    return block, max(1, min(8, block // 512))


@triton.jit
def _row_start(ptr, n, T, stride_b, stride_t):
    """Pointer to row n = b * T + t of a [B, T, V] layout with unit stride along V."""
    b = n // T
    return ptr + b * stride_b + (n - b * T) * stride_t


@triton.jit
def _row_lse(row, V, BLOCK_V: tl.constexpr):
    """log sum exp of a row of V logits (unit stride) in fp32: a running max ``m`` and ``s = sum exp(x - m)``
    rescaled when the max grows, over chunks of ``BLOCK_V`` (one exp per element)."""
    cols = tl.arange(0, BLOCK_V)
    m = tl.full([], FP32_LOWEST, tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, V, BLOCK_V):
        c = start + cols
        x = tl.load(row + c, mask=c < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    return m + tl.log(s)


@triton.jit
def _ce_fwd_kernel(x_ptr, tgt_ptr, loss_ptr, lse_ptr, V, T, stride_b, stride_t, ignore_index,
                BLOCK_V: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    row = _row_start(x_ptr, n, T, stride_b, stride_t)
    tgt = tl.load(tgt_ptr + n).to(tl.int64)
    if tgt == ignore_index:
        tl.store(loss_ptr + n, 0.0)
        tl.store(lse_ptr + n, 0.0)
    else:
        lse = _row_lse(row, V, BLOCK_V)
        ok = (tgt >= 0) & (tgt < V)
        x_t = tl.load(row + tgt, mask=ok, other=float("nan")).to(tl.float32)
        tl.store(loss_ptr + n, lse - x_t)
        tl.store(lse_ptr + n, lse)


@triton.jit
def _ce_bwd_kernel(x_ptr, tgt_ptr, lse_ptr, g_ptr, dx_ptr, V, T, stride_b, stride_t, dstride_b, dstride_t,
                stride_g, ignore_index, BLOCK_V: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    row = _row_start(x_ptr, n, T, stride_b, stride_t)
    drow = _row_start(dx_ptr, n, T, dstride_b, dstride_t)
    tgt = tl.load(tgt_ptr + n).to(tl.int64)
    cols = tl.arange(0, BLOCK_V)
    if tgt == ignore_index:
        zero = tl.zeros([BLOCK_V], dtype=dx_ptr.dtype.element_ty)
        for start in range(0, V, BLOCK_V):
            c = start + cols
            tl.store(drow + c, zero, mask=c < V)
    else:
        lse = tl.load(lse_ptr + n)
        g = tl.load(g_ptr + n * stride_g).to(tl.float32)
        for start in range(0, V, BLOCK_V):
            c = start + cols
            x = tl.load(row + c, mask=c < V, other=0.0).to(tl.float32)
            d = g * (tl.exp(x - lse) - (c == tgt).to(tl.float32))
            tl.store(drow + c, d.to(dx_ptr.dtype.element_ty), mask=c < V)


@triton.jit
def _fwd_grad_chunks(x_ptr, tgt_ptr, loss_ptr, n, V, stride_n, ignore_index, BLOCK_V: tl.constexpr):
    """Row n: ``_ce_fwd_kernel``'s loss, then the row's gradient for an upstream gradient of 1, ``softmax -
    onehot``, written over the row itself in a second pass over its chunks; ignored rows get zeros."""
    row = x_ptr + n * stride_n
    tgt = tl.load(tgt_ptr + n).to(tl.int64)
    cols = tl.arange(0, BLOCK_V)
    if tgt == ignore_index:
        tl.store(loss_ptr + n, 0.0)
        zero = tl.zeros([BLOCK_V], dtype=x_ptr.dtype.element_ty)
        for start in range(0, V, BLOCK_V):
            c = start + cols
            tl.store(row + c, zero, mask=c < V)
    else:
        # x_t before the row's reductions: their barriers keep every warp's read of it ahead of any warp's
        # gradient store over the row (read after them, a warp could see another's gradient there)
        ok = (tgt >= 0) & (tgt < V)
        x_t = tl.load(row + tgt, mask=ok, other=float("nan")).to(tl.float32)
        lse = _row_lse(row, V, BLOCK_V)
        tl.store(loss_ptr + n, lse - x_t)
        for start in range(0, V, BLOCK_V):
            c = start + cols
            x = tl.load(row + c, mask=c < V, other=0.0).to(tl.float32)
            d = tl.exp(x - lse) - (c == tgt).to(tl.float32)
            tl.store(row + c, d.to(x_ptr.dtype.element_ty), mask=c < V)


@triton.jit
def _ce_fwd_grad_kernel(x_ptr, tgt_ptr, loss_ptr, N, V, stride_n, ignore_index, BLOCK_V: tl.constexpr,
                        PERSISTENT: tl.constexpr):
    """:func:`_fwd_grad_chunks` for row ``program_id`` (one program a row), or with ``PERSISTENT`` for rows
    ``program_id, program_id + num_programs, ...`` (a grid sized so that the rows in flight fit in L2 and each
    row's second pass finds it there). Rows ``stride_n`` apart, unit stride along V."""
    if PERSISTENT:
        for n in range(tl.program_id(0), N, tl.num_programs(0)):
            _fwd_grad_chunks(x_ptr, tgt_ptr, loss_ptr, n + tl.zeros([], tl.int64), V, stride_n, ignore_index, BLOCK_V)
    else:
        _fwd_grad_chunks(x_ptr, tgt_ptr, loss_ptr, tl.program_id(0).to(tl.int64), V, stride_n, ignore_index, BLOCK_V)


@triton.jit
def _ce_fwd_grad_row_kernel(x_ptr, tgt_ptr, loss_ptr, V, stride_n, ignore_index, BLOCK_V: tl.constexpr):
    """The same as :func:`_ce_fwd_grad_kernel` with the whole row in registers (``BLOCK_V >= V``): one read of the
    logits and one write of their gradient."""
    n = tl.program_id(0).to(tl.int64)
    row = x_ptr + n * stride_n
    tgt = tl.load(tgt_ptr + n).to(tl.int64)
    cols = tl.arange(0, BLOCK_V)
    cm = cols < V
    if tgt == ignore_index:
        tl.store(loss_ptr + n, 0.0)
        tl.store(row + cols, tl.zeros([BLOCK_V], dtype=x_ptr.dtype.element_ty), mask=cm)
    else:
        ok = (tgt >= 0) & (tgt < V)
        x_t = tl.load(row + tgt, mask=ok, other=float("nan")).to(tl.float32)  # before the reductions' barriers
        x = tl.load(row + cols, mask=cm, other=float("-inf")).to(tl.float32)  # (see _fwd_grad_chunks)
        m = tl.max(x, 0)
        e = tl.exp(x - m)
        s = tl.sum(e, 0)
        tl.store(loss_ptr + n, m + tl.log(s) - x_t)
        d = e * (1.0 / s) - (cols == tgt).to(tl.float32)
        tl.store(row + cols, d.to(x_ptr.dtype.element_ty), mask=cm)


# The forward-with-gradient kernel's form: "row" (the whole row in registers, V <= FWD_GRAD_ROW_MAX_V, else
# "chunks"), "chunks" (two passes over BLOCK_V chunks, one program a row) or "persistent" (the same with
# FWD_GRAD_PROGRAMS_PER_SM programs an SM looping over the rows). Session 37 (H100, call1): "chunks" took 2.11 ms at
# the small model's 32768 x 32768 bf16 logits, the time of the separate forward and backward kernels (0.68 + 1.44):
# the second pass missed L2 (up to 8 programs an SM x 64 KB rows in flight). Call2 (bench_cross_entropy.py --linear
# --fwd-grad-sweep): "row" 1.767 ms at 32 warps (1.813 at 16, 2.365 at 8), "chunks" 2.142, "persistent" 2.065-3.606
# at 1-8 programs an SM; a copy of the logits 1.422.
FWD_GRAD_MODE = "row"
FWD_GRAD_ROW_MAX_V = 32768
FWD_GRAD_ROW_WARPS = 32
FWD_GRAD_PROGRAMS_PER_SM = 2


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def ce_forward_grad_(logits_NV: torch.Tensor, target_N: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Per-row loss ``[N]`` fp32 of contiguous-row logits ``[N, V]``, which are overwritten with the gradient of
    each row's loss (``softmax - onehot(target)``, zeros on ignored rows) in their own dtype (``FWD_GRAD_MODE``)."""
    N, V = logits_NV.shape
    loss = torch.empty(N, dtype=torch.float32, device=logits_NV.device)
    if not N:
        return loss
    args = (logits_NV, target_N, loss)
    if FWD_GRAD_MODE == "row" and V <= FWD_GRAD_ROW_MAX_V:
        block = triton.next_power_of_2(V)
        _ce_fwd_grad_row_kernel[(N,)](*args, V, logits_NV.stride(0), ignore_index, BLOCK_V=block,
                                      num_warps=max(1, min(FWD_GRAD_ROW_WARPS, block // 256)))
        return loss
    block, warps = _config(V)
    persistent = FWD_GRAD_MODE == "persistent"
    grid = min(N, FWD_GRAD_PROGRAMS_PER_SM * _sm_count(logits_NV.device)) if persistent else N
    _ce_fwd_grad_kernel[(grid,)](*args, N, V, logits_NV.stride(0), ignore_index, BLOCK_V=block,
                                 PERSISTENT=persistent, num_warps=warps)
    return loss


@triton.jit
def _scale_rows_kernel(x_ptr, g_ptr, out_ptr, N, D, BR: tl.constexpr, BD: tl.constexpr):
    """``out[n] = x[n] * g[n]`` for BR rows of D (contiguous) a program: fp32 products rounded once to out's dtype."""
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    m = (rows < N)[:, None] & (cols < D)[None, :]
    off = rows[:, None] * D + cols[None, :]
    g = tl.load(g_ptr + rows, mask=rows < N, other=0.0)
    x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + off, (x * g[:, None]).to(out_ptr.dtype.element_ty), mask=m)


def scale_rows(x_ND: torch.Tensor, g_N: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x_ND * g_N[:, None]`` (contiguous ``x``, fp32 ``g``) in x's dtype, into ``out`` (may be ``x``) or a new
    tensor: one vectorised pass (PyTorch's mixed-dtype multiply into a 16-bit tensor is not vectorised: 0.10 ms for
    the small model's 32768 x 768 on an H100, session 37 call1)."""
    N, D = x_ND.shape
    out = torch.empty_like(x_ND) if out is None else out
    BD = triton.next_power_of_2(max(D, 1))
    BR = max(1, min(16, 4096 // BD))
    if N:
        _scale_rows_kernel[(triton.cdiv(N, BR),)](x_ND, g_N, out, N, D, BR=BR, BD=BD, num_warps=4)
    return out


def _layout(x: torch.Tensor) -> tuple[int, int, int]:
    """(T, stride_b, stride_t) of a [N, V] (as B = 1) or [B, T, V] tensor with unit stride along V."""
    if x.dim() == 2:
        return max(x.shape[0], 1), 0, x.stride(0)
    return max(x.shape[1], 1), x.stride(0), x.stride(1)


def ce_forward(logits: torch.Tensor, target_N: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """loss ``[N]`` fp32 and lse ``[N]`` fp32 of logits ``[N, V]`` / ``[B, T, V]`` (unit stride along V)."""
    N, V = target_N.numel(), logits.shape[-1]
    loss = torch.empty(N, dtype=torch.float32, device=logits.device)
    lse = torch.empty(N, dtype=torch.float32, device=logits.device)
    if N == 0:
        return loss, lse
    block, warps = _config(V)
    T, sb, st = _layout(logits)
    _ce_fwd_kernel[(N,)](logits, target_N, loss, lse, V, T, sb, st, ignore_index, BLOCK_V=block, num_warps=warps)
    return loss, lse


def ce_backward(logits: torch.Tensor, target_N: torch.Tensor, lse_N: torch.Tensor, grad_N: torch.Tensor,
                ignore_index: int, inplace: bool) -> torch.Tensor:
    """dlogits in the logits' dtype and shape: a new contiguous tensor, or the logits themselves if ``inplace``."""
    dx = logits if inplace else torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    N, V = target_N.numel(), logits.shape[-1]
    if N == 0:
        return dx
    block, warps = _config(V)
    T, sb, st = _layout(logits)
    _, dsb, dst = _layout(dx)
    _ce_bwd_kernel[(N,)](logits, target_N, lse_N, grad_N, dx, V, T, sb, st, dsb, dst, grad_N.stride(0),
                      ignore_index, BLOCK_V=block, num_warps=warps)
    return dx


class CrossEntropyFunction(torch.autograd.Function):
    """Per-row loss ``[N]`` fp32 of logits ``[N, V]`` / ``[B, T, V]``; backward recomputes the softmax."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target_N: torch.Tensor, ignore_index: int,
                inplace_backward: bool) -> torch.Tensor:
        loss, lse = ce_forward(logits, target_N, ignore_index)
        ctx.save_for_backward(logits, target_N, lse)
        ctx.ignore_index, ctx.inplace = ignore_index, inplace_backward
        return loss

    @staticmethod
    def backward(ctx, grad_N: torch.Tensor):
        logits, target_N, lse = ctx.saved_tensors
        dx = ce_backward(logits, target_N, lse, grad_N, ctx.ignore_index, ctx.inplace)
        return dx, None, None, None


def cross_entropy_triton(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                         reduction: str = "mean", inplace_backward: bool = False) -> torch.Tensor:
    """Triton path of ``kernels.cross_entropy.cross_entropy`` (inputs already validated); fp32 loss."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    target_N = target.reshape(-1).contiguous()
    loss_N = CrossEntropyFunction.apply(logits, target_N, ignore_index, inplace_backward)
    return reduce_rows(loss_N, target, ignore_index, reduction)


def reduce_rows(loss_N: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    """The per-row losses ``[N]`` in the target's shape (``"none"``), their sum, or their mean over the rows whose
    target is not ``ignore_index``."""
    if reduction == "none":
        return loss_N.view(target.shape)
    if reduction == "sum":
        return loss_N.sum()
    return loss_N.sum() / (target.reshape(-1) != ignore_index).sum()
