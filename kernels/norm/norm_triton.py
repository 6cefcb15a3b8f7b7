"""Fused Triton RMSNorm, gated RMSNorm and SwiGLU activation, forward and backward (GPU; also under
``TRITON_INTERPRET=1``). The maths of ``norm_torch.py`` (the references) in one pass over memory each way.

Shapes: rows ``x [M, D]`` (leading dims flattened, contiguous), ``weight [D]``, ``gate [M, D]``; the SwiGLU
input ``gate_up [M, 2I]`` (gate half first) and output ``[M, I]``.

- Norm forward, one program per ``BLOCK_M`` rows (one row when there are few: decode) x all of ``D``
  (``BLOCK_D`` = next power of two): fp32 mean of squares, ``rstd`` saved (fp32 ``[M]``, the only extra
  tensor). Plain RMSNorm rounds ``x * rstd`` to x's dtype before the gain and returns the promoted dtype of x and
  the gain (like the PyTorch path); the gated form stays fp32 to the end and returns x's dtype.
- Norm backward, grid-stride: ``NORM_BWD_TILES`` row tiles per program, recomputes ``x_hat = x * rstd``,
  ``dx = rstd (dn - x_hat mean(dn x_hat))`` with ``dn = dy w [sigmoid(gate)]`` and, gated,
  ``dgate = dy w x_hat s (1 - s)``; the weight gradient is summed per program in fp32 and the ``[P, D]``
  partials are reduced by ``kernels.colsum.column_sum`` (deterministic, no atomics). Rows of one chunk (at most a
  warp's width of 16-byte vectors) go to ``_norm_bwd_rows_kernel`` instead: the row's sum a warp shuffle, the
  gain's gradient per thread until the end (``NORM_BWD_ROWS``, ``NORM_ROWS_*``).
- LayerNorm forward (mean and ``rstd`` saved, fp32 ``[M]`` each; the affine map in fp32, y in x's dtype) and
  backward ``dx = rstd (dn - mean(dn) - x_hat mean(dn x_hat))``, ``dn = dy w``, with the gain and bias gradients
  summed per program like the RMSNorm's.
- SwiGLU forward ``y = silu(g) u`` and backward ``dg = dy u s (1 + g (1 - s))``, ``du = dy silu(g)`` in fp32,
  written straight into ``d gate_up [M, 2I]``, so the split halves never exist as separate tensors.

Every launch uses the fixed configurations below (no autotuning).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import sm_count
from kernels.colsum import column_sum

NORM_TILE_ELEMS = 4096  # BLOCK_M * BLOCK_D per program
NORM_FEW_ROWS = 64  # forward over at most this many rows (decode): one row a program, NORM_FEW_ROWS_WARPS warps
NORM_FEW_ROWS_WARPS = 4
NORM_BWD_TILES = 8  # row tiles per backward program
NORM_WARPS = 4
NORM_BWD_TILE_ELEMS = 4096  # the backward tile kernel's BLOCK_M * BLOCK_D (and LayerNorm's backward)
NORM_BWD_WARPS = 4
# The backward in the row layout (_norm_bwd_rows_kernel) where a row is at most NORM_ROWS_MAX_CHUNKS chunks, else the
# tile kernel. H200, bf16, CUDA-graph replays (session 32 call3, `bench_norm.py --bwd-sweep`), tile / row kernel (8
# elements a thread, 8 programs an SM): [32768, 768] 0.052 / 0.080 ms, with the stream's gradient 0.075 / 0.102, the
# KDA output's gated norm [196608, 128] 0.110 / 0.078 (0.074 at 4 elements): so only one-chunk rows take it.
NORM_BWD_ROWS = True
NORM_ROWS_MAX_CHUNKS = 1
NORM_ROWS_THREAD_ELEMS = 4  # elements of one chunk-wide tile per thread (sets BLOCK_T)
NORM_ROWS_PROGRAMS_PER_SM = 8
ACT_BLOCK_M, ACT_BLOCK_I, ACT_WARPS = 4, 1024, 4


@triton.jit
def _norm_fwd_kernel(x_ptr, g_ptr, w_ptr, y_ptr, rstd_ptr, r_ptr, s_ptr, M, D, eps, BLOCK_M: tl.constexpr,
                     BLOCK_D: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr, STORE_RSTD: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    m = (rows < M)[:, None] & (cols < D)[None, :]
    off = rows[:, None] * D + cols[None, :]
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]  # before the reduction's barrier
    x = tl.load(x_ptr + off, mask=m, other=0.0)
    if RESIDUAL:  # the residual update s = x + r, rounded and stored as torch.add would, normalised after
        x = (x.to(tl.float32) + tl.load(r_ptr + off, mask=m, other=0.0).to(tl.float32)).to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + off, x, mask=m)
    x = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)
    x_hat = x * rstd[:, None]
    if GATED:
        sg = tl.sigmoid(tl.load(g_ptr + off, mask=m, other=0.0).to(tl.float32))
        y = w * x_hat * sg
    else:
        y = w * x_hat.to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=m)
    if STORE_RSTD:  # (inference's residual form has no backward to read it)
        tl.store(rstd_ptr + rows, rstd, mask=rows < M)


@triton.jit
def _bwd_tile(x_ptr, dy_ptr, pid, it, TILES: tl.constexpr, BLOCK_M: tl.constexpr, cols, M, D):
    """Tile ``it`` of a backward program's ``TILES`` row tiles: rows, mask, offsets, x and dy in fp32."""
    rows = (pid * TILES + it) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = (rows < M)[:, None] & (cols < D)[None, :]
    off = rows[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32)
    return rows, m, off, x, dy


@triton.jit
def _norm_bwd_kernel(x_ptr, g_ptr, w_ptr, rstd_ptr, dy_ptr, dx_ptr, dg_ptr, dw_ptr, ds_ptr, M, D,
                     BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, TILES: tl.constexpr, GATED: tl.constexpr,
                     STREAM: tl.constexpr = False):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    dw = tl.zeros([BLOCK_D], dtype=tl.float32)
    for it in range(TILES):
        rows, m, off, x, dy = _bwd_tile(x_ptr, dy_ptr, pid, it, TILES, BLOCK_M, cols, M, D)
        rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        x_hat = x * rstd[:, None]
        if GATED:
            s = tl.sigmoid(tl.load(g_ptr + off, mask=m, other=0.0).to(tl.float32))
            dn = dy * w * s
            dw += tl.sum(dy * x_hat * s, axis=0)
            tl.store(dg_ptr + off, (dy * w * x_hat * s * (1.0 - s)).to(dg_ptr.dtype.element_ty), mask=m)
        else:
            dn = dy * w
            dw += tl.sum(dy * x_hat.to(x_ptr.dtype.element_ty).to(tl.float32), axis=0)
        dx = rstd[:, None] * (dn - x_hat * (tl.sum(dn * x_hat, axis=1) / D)[:, None])
        if STREAM:  # the residual stream's own gradient, added in fp32 (add_rms_norm's backward)
            dx += tl.load(ds_ptr + off, mask=m, other=0.0).to(tl.float32)
        tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=m)
    tl.store(dw_ptr + pid * D + cols, dw, mask=cols < D)


@triton.jit
def _norm_bwd_rows_kernel(x_ptr, g_ptr, w_ptr, rstd_ptr, dy_ptr, dx_ptr, dg_ptr, dw_ptr, ds_ptr, M, D, num_tiles,
                          BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, CH: tl.constexpr, GATED: tl.constexpr,
                          STREAM: tl.constexpr):
    """:func:`_norm_bwd_kernel`'s maths in the row layout: a row is ``CH`` chunks of ``CHUNK`` columns (at most a
    warp's width of 16-byte vectors each), so the row's sum ``dn . x_hat`` is a warp shuffle, not a reduction across
    the program's warps; the gain's gradient stays per thread (``[BLOCK_T, CHUNK]`` per chunk) over the program's
    grid-stride tiles and is reduced once at the end."""
    pid = tl.program_id(0)
    ws, dws = (), ()
    for c in tl.static_range(CH):
        cols = c * CHUNK + tl.arange(0, CHUNK)
        ws = ws + (tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32),)
        dws = dws + (tl.zeros([BLOCK_T, CHUNK], dtype=tl.float32),)
    for tile in range(pid, num_tiles, tl.num_programs(0)):
        rows = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        base = rows.to(tl.int64)[:, None] * D
        dot = tl.zeros([BLOCK_T], dtype=tl.float32)
        x_hats, dns, new_dws = (), (), ()
        for c in tl.static_range(CH):
            cols = c * CHUNK + tl.arange(0, CHUNK)
            m = (rows < M)[:, None] & (cols < D)[None, :]
            off = base + cols[None, :]
            x_hat = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32) * rstd[:, None]
            dy = tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32)
            if GATED:
                sg = tl.sigmoid(tl.load(g_ptr + off, mask=m, other=0.0).to(tl.float32))
                dn = dy * ws[c][None, :] * sg
                new_dws = new_dws + (dws[c] + dy * x_hat * sg,)
                tl.store(dg_ptr + off, (dn * x_hat * (1.0 - sg)).to(dg_ptr.dtype.element_ty), mask=m)
            else:
                dn = dy * ws[c][None, :]
                new_dws = new_dws + (dws[c] + dy * x_hat.to(x_ptr.dtype.element_ty).to(tl.float32),)
            dot += tl.sum(dn * x_hat, axis=1)
            x_hats, dns = x_hats + (x_hat,), dns + (dn,)
        dws = new_dws
        dot = dot / D
        for c in tl.static_range(CH):
            cols = c * CHUNK + tl.arange(0, CHUNK)
            m = (rows < M)[:, None] & (cols < D)[None, :]
            off = base + cols[None, :]
            dx = rstd[:, None] * (dns[c] - x_hats[c] * dot[:, None])
            if STREAM:  # the residual stream's own gradient, added in fp32 (add_rms_norm's backward)
                dx += tl.load(ds_ptr + off, mask=m, other=0.0).to(tl.float32)
            tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=m)
    for c in tl.static_range(CH):
        cols = c * CHUNK + tl.arange(0, CHUNK)
        tl.store(dw_ptr + pid * D + cols, tl.sum(dws[c], axis=0), mask=cols < D)


@triton.jit
def _ln_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, D, eps, BLOCK_M: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    m = (rows < M)[:, None] & (cols < D)[None, :]
    off = rows[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / D
    xc = tl.where(m, x - mean[:, None], 0.0)
    rstd = tl.math.rsqrt(tl.sum(xc * xc, axis=1) / D + eps)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    b = tl.load(b_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + off, (xc * rstd[:, None] * w + b).to(y_ptr.dtype.element_ty), mask=m)
    tl.store(mean_ptr + rows, mean, mask=rows < M)
    tl.store(rstd_ptr + rows, rstd, mask=rows < M)


@triton.jit
def _ln_bwd_kernel(x_ptr, w_ptr, mean_ptr, rstd_ptr, dy_ptr, dx_ptr, dw_ptr, db_ptr, M, D, BLOCK_M: tl.constexpr,
                   BLOCK_D: tl.constexpr, TILES: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    dw = tl.zeros([BLOCK_D], dtype=tl.float32)
    db = tl.zeros([BLOCK_D], dtype=tl.float32)
    for it in range(TILES):
        rows, m, off, x, dy = _bwd_tile(x_ptr, dy_ptr, pid, it, TILES, BLOCK_M, cols, M, D)
        mean = tl.load(mean_ptr + rows, mask=rows < M, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        x_hat = tl.where(m, (x - mean[:, None]) * rstd[:, None], 0.0)
        dn = dy * w
        dw += tl.sum(dy * x_hat, axis=0)
        db += tl.sum(dy, axis=0)
        dx = rstd[:, None] * (dn - (tl.sum(dn, axis=1) / D)[:, None] - x_hat * (tl.sum(dn * x_hat, axis=1) / D)[:, None])
        tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=m)
    tl.store(dw_ptr + pid * D + cols, dw, mask=cols < D)
    tl.store(db_ptr + pid * D + cols, db, mask=cols < D)


@triton.jit
def _gate_up_tile(gu_ptr, M, I, BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr):
    """This program's ``[BLOCK_M, BLOCK_I]`` tile of the gate and up halves of ``gate_up [M, 2I]`` in fp32, with
    its rows, columns, mask and offsets into ``gate_up``."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    m = (rows < M)[:, None] & (cols < I)[None, :]
    off = rows[:, None] * (2 * I) + cols[None, :]
    g = tl.load(gu_ptr + off, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + off + I, mask=m, other=0.0).to(tl.float32)
    return rows, cols, m, off, g, u


@triton.jit
def _silu_mul_fwd_kernel(gu_ptr, y_ptr, M, I, BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr):
    rows, cols, m, off, g, u = _gate_up_tile(gu_ptr, M, I, BLOCK_M, BLOCK_I)
    y = g * tl.sigmoid(g) * u
    tl.store(y_ptr + rows[:, None] * I + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _silu_mul_bwd_kernel(gu_ptr, dy_ptr, dgu_ptr, M, I, BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr):
    rows, cols, m, off, g, u = _gate_up_tile(gu_ptr, M, I, BLOCK_M, BLOCK_I)
    dy = tl.load(dy_ptr + rows[:, None] * I + cols[None, :], mask=m, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    tl.store(dgu_ptr + off, (dy * u * s * (1.0 + g * (1.0 - s))).to(dgu_ptr.dtype.element_ty), mask=m)
    tl.store(dgu_ptr + off + I, (dy * g * s).to(dgu_ptr.dtype.element_ty), mask=m)


def _norm_blocks(D: int) -> tuple[int, int]:
    block_d = triton.next_power_of_2(D)
    return max(1, NORM_TILE_ELEMS // block_d), block_d


def _fwd_launch(M: int, D: int) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_D, num_warps)`` of a forward: few rows (decode, latency-bound) one a program, so that no
    thread works on masked rows."""
    block_m, block_d = _norm_blocks(D)
    if M <= NORM_FEW_ROWS:
        return 1, block_d, NORM_FEW_ROWS_WARPS
    return block_m, block_d, NORM_WARPS


def _out_dtype(x: torch.Tensor, weight: torch.Tensor, gated: bool) -> torch.dtype:
    """x's dtype when gated, else the promoted dtype of x and weight (what ``weight * x_hat.to(x.dtype)`` gives in
    PyTorch, e.g. fp32 for bf16 x under autocast with fp32 weights); promote_types is a dispatched op: skipped when
    the dtypes are equal."""
    return x.dtype if gated or x.dtype == weight.dtype else torch.promote_types(x.dtype, weight.dtype)


def norm_fwd(x_MD: torch.Tensor, gate_MD: torch.Tensor | None, weight: torch.Tensor,
             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y [M, D], rstd [M] fp32)``, y in :func:`_out_dtype`."""
    M, D = x_MD.shape
    y = torch.empty(M, D, dtype=_out_dtype(x_MD, weight, gate_MD is not None), device=x_MD.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x_MD.device)
    block_m, block_d, warps = _fwd_launch(M, D)
    if M:
        _norm_fwd_kernel[(triton.cdiv(M, block_m),)](
            x_MD, gate_MD if gate_MD is not None else x_MD, weight, y, rstd, x_MD, x_MD, M, D, eps,
            BLOCK_M=block_m, BLOCK_D=block_d, GATED=gate_MD is not None, RESIDUAL=False, STORE_RSTD=True,
            num_warps=warps)
    return y, rstd


def add_norm_fwd(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 with_rstd: bool = False) -> tuple[torch.Tensor, ...]:
    """``(s, y)``, with ``with_rstd`` ``(s, y, rstd [M] fp32)``: ``s = x + residual`` rounded to x's dtype, ``y``
    the RMSNorm of ``s`` (in :func:`_out_dtype`), in one launch: a residual update and the next sublayer's input
    norm (``rstd`` for a backward, :class:`AddNormFunction`). ``x``, ``residual`` contiguous ``[..., D]`` of one
    shape and dtype, ``weight`` contiguous ``[D]``; the outputs take x's shape, and no views are made (decode is
    launch-bound: the allocations are this call's only operators)."""
    D = x.shape[-1]
    M = x.numel() // D if D else 0
    s = torch.empty_like(x)
    y = torch.empty(x.shape, dtype=_out_dtype(x, weight, False), device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device) if with_rstd else None
    block_m, block_d, warps = _fwd_launch(M, D)
    if M:
        _norm_fwd_kernel[(triton.cdiv(M, block_m),)](
            x, x, weight, y, rstd if with_rstd else x, residual, s, M, D, eps, BLOCK_M=block_m, BLOCK_D=block_d,
            GATED=False, RESIDUAL=True, STORE_RSTD=with_rstd, num_warps=warps)
    return (s, y, rstd) if with_rstd else (s, y)


def _bwd_grid(M: int, D: int) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_D, TILES, programs)`` of a backward launch: each program walks ``TILES`` row tiles and
    writes one fp32 partial sum of the affine gradients."""
    block_d = triton.next_power_of_2(D)
    block_m = max(1, NORM_BWD_TILE_ELEMS // block_d)
    tiles = max(1, min(NORM_BWD_TILES, triton.cdiv(M, block_m)))
    return block_m, block_d, tiles, triton.cdiv(M, block_m * tiles)


def _row_layout(M: int, D: int, elem_bytes: int, device: torch.device) -> tuple[int, int, int, int] | None:
    """``(BLOCK_T, CHUNK, CH, programs)`` of :func:`_norm_bwd_rows_kernel` for ``[M, D]`` rows, or ``None`` when a
    row would take more than ``NORM_ROWS_MAX_CHUNKS`` chunks (or ``NORM_BWD_ROWS`` is off): ``CHUNK`` the next power
    of two of D up to a warp's width of 16-byte vectors, ``BLOCK_T`` rows giving each thread about
    ``NORM_ROWS_THREAD_ELEMS`` elements of a chunk, ``NORM_ROWS_PROGRAMS_PER_SM`` grid-stride programs an SM."""
    chunk = min(max(16, triton.next_power_of_2(D)), 32 * 16 // elem_bytes)
    ch = triton.cdiv(D, chunk)
    if not NORM_BWD_ROWS or ch > NORM_ROWS_MAX_CHUNKS:
        return None
    rows = max(1, NORM_ROWS_THREAD_ELEMS * 32 * NORM_WARPS // chunk)
    block_t = 1 << (rows.bit_length() - 1)
    sms = sm_count(device) if device.type == "cuda" else 1
    return block_t, chunk, ch, max(1, min(triton.cdiv(M, block_t), NORM_ROWS_PROGRAMS_PER_SM * sms))


def norm_bwd(x_MD: torch.Tensor, gate_MD: torch.Tensor | None, weight: torch.Tensor, rstd_M: torch.Tensor,
             dy_MD: torch.Tensor, ds_MD: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                             torch.Tensor]:
    """``(dx, dgate or None, dweight in weight's dtype)``; with ``ds_MD`` (plain RMSNorm only), ``dx`` also holds
    that gradient, added in fp32 before the one rounding to x's dtype."""
    M, D = x_MD.shape
    dx = torch.empty_like(x_MD)
    dg = torch.empty_like(gate_MD) if gate_MD is not None else None
    layout = _row_layout(M, D, x_MD.element_size(), x_MD.device) if M else None
    if layout is not None:
        block_t, chunk, ch, n_prog = layout
    else:
        block_m, block_d, tiles, n_prog = _bwd_grid(M, D)
    dw_part = torch.empty(n_prog, D, dtype=torch.float32, device=x_MD.device)  # every program writes its row
    args = (x_MD, gate_MD if gate_MD is not None else x_MD, weight, rstd_M, dy_MD, dx, dg if dg is not None else dx,
            dw_part, ds_MD if ds_MD is not None else dx, M, D)
    forms = dict(GATED=gate_MD is not None, STREAM=ds_MD is not None)
    if layout is not None:
        _norm_bwd_rows_kernel[(n_prog,)](*args, triton.cdiv(M, block_t), BLOCK_T=block_t, CHUNK=chunk, CH=ch,
                                         **forms, num_warps=NORM_WARPS)
    elif M:
        _norm_bwd_kernel[(n_prog,)](*args, BLOCK_M=block_m, BLOCK_D=block_d, TILES=tiles, **forms,
                                    num_warps=NORM_BWD_WARPS)
    return dx, dg, column_sum(dw_part, weight.dtype)


def layer_norm_fwd(x_MD: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y [M, D] in x's dtype, mean [M], rstd [M])``, statistics and the affine map in fp32."""
    M, D = x_MD.shape
    y = torch.empty_like(x_MD)
    mean = torch.empty(M, dtype=torch.float32, device=x_MD.device)
    rstd = torch.empty_like(mean)
    block_m, block_d = _norm_blocks(D)
    if M:
        _ln_fwd_kernel[(triton.cdiv(M, block_m),)](x_MD, weight, bias, y, mean, rstd, M, D, eps, BLOCK_M=block_m,
                                                   BLOCK_D=block_d, num_warps=NORM_WARPS)
    return y, mean, rstd


def layer_norm_bwd(x_MD: torch.Tensor, weight: torch.Tensor, mean_M: torch.Tensor, rstd_M: torch.Tensor,
                   dy_MD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx in x's dtype, dweight, dbias in weight's dtype)``, the affine gradients summed per program in fp32."""
    M, D = x_MD.shape
    block_m, block_d, tiles, n_prog = _bwd_grid(M, D)
    dx = torch.empty_like(x_MD)
    part = torch.empty(2, n_prog, D, dtype=torch.float32, device=x_MD.device)  # every program writes its rows
    if M:
        _ln_bwd_kernel[(n_prog,)](x_MD, weight, mean_M, rstd_M, dy_MD, dx, part[0], part[1], M, D, BLOCK_M=block_m,
                                  BLOCK_D=block_d, TILES=tiles, num_warps=NORM_BWD_WARPS)
    return dx, column_sum(part[0], weight.dtype), column_sum(part[1], weight.dtype)


def silu_mul_fwd(gu_M2I: torch.Tensor) -> torch.Tensor:
    M, I = gu_M2I.shape[0], gu_M2I.shape[1] // 2
    y = torch.empty(M, I, dtype=gu_M2I.dtype, device=gu_M2I.device)
    if M and I:
        grid = (triton.cdiv(M, ACT_BLOCK_M), triton.cdiv(I, ACT_BLOCK_I))
        _silu_mul_fwd_kernel[grid](gu_M2I, y, M, I, BLOCK_M=ACT_BLOCK_M, BLOCK_I=ACT_BLOCK_I, num_warps=ACT_WARPS)
    return y


def silu_mul_bwd(gu_M2I: torch.Tensor, dy_MI: torch.Tensor) -> torch.Tensor:
    M, I = dy_MI.shape
    dgu = torch.empty_like(gu_M2I)
    if M and I:
        grid = (triton.cdiv(M, ACT_BLOCK_M), triton.cdiv(I, ACT_BLOCK_I))
        _silu_mul_bwd_kernel[grid](gu_M2I, dy_MI, dgu, M, I, BLOCK_M=ACT_BLOCK_M, BLOCK_I=ACT_BLOCK_I,
                                   num_warps=ACT_WARPS)
    return dgu


class NormFunction(torch.autograd.Function):
    """RMSNorm (``gate`` None) or gated RMSNorm over the last dim; gradients for x, gate and weight."""

    @staticmethod
    def forward(ctx, x, gate, weight, eps: float):
        shape = x.shape
        x_MD = x.reshape(-1, shape[-1]).contiguous()
        gate_MD = gate.reshape(-1, shape[-1]).contiguous() if gate is not None else None
        w = weight.contiguous()
        y, rstd = norm_fwd(x_MD, gate_MD, w, eps)
        ctx.save_for_backward(x_MD, gate_MD, w, rstd)
        ctx.shape = shape
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x_MD, gate_MD, w, rstd = ctx.saved_tensors
        dx, dg, dw = norm_bwd(x_MD, gate_MD, w, rstd, dy.reshape(x_MD.shape).contiguous())
        return dx.view(ctx.shape), (dg.view(ctx.shape) if dg is not None else None), dw, None


class AddNormFunction(torch.autograd.Function):
    """``(x, residual, weight) -> (s, y)``: ``s = x + residual`` (x's dtype) and ``y = RMSNorm(s)``, one forward
    launch. Backward: the stream's gradient ``ds`` and the norm's ``dy`` give ``dh = ds + dRMSNorm(dy)`` in one
    launch (``ds`` added in fp32 before the one rounding), which is the gradient of both x and the residual.
    Autograd would instead round the norm's dx, then add ``ds`` in a separate kernel (the forward's add too)."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps: float):
        shape = x.shape
        d = shape[-1]
        w = weight.contiguous()
        s, y, rstd = add_norm_fwd(x.reshape(-1, d).contiguous(), residual.reshape(-1, d).contiguous(), w, eps,
                                  with_rstd=True)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(s, w, rstd)
        ctx.shape = shape
        return s.view(shape), y.view(shape)

    @staticmethod
    def backward(ctx, ds, dy):
        s, w, rstd = ctx.saved_tensors
        if dy is None:  # (y unused: the stream's gradient passes straight to both inputs)
            return ds, ds, None, None
        ds = None if ds is None else ds.reshape(s.shape).contiguous()
        dh, _, dw = norm_bwd(s, None, w, rstd, dy.reshape(s.shape).contiguous(), ds)
        dh = dh.view(ctx.shape)
        return dh, dh, dw, None


class SiluMulFunction(torch.autograd.Function):
    """``silu(gate_up[..., :I]) * gate_up[..., I:]``; the gradient is written as one ``[..., 2I]`` tensor."""

    @staticmethod
    def forward(ctx, gate_up):
        shape = gate_up.shape
        gu = gate_up.reshape(-1, shape[-1]).contiguous()
        ctx.save_for_backward(gu)
        ctx.shape = shape
        return silu_mul_fwd(gu).view(*shape[:-1], shape[-1] // 2)

    @staticmethod
    def backward(ctx, dy):
        (gu,) = ctx.saved_tensors
        return silu_mul_bwd(gu, dy.reshape(gu.shape[0], -1).contiguous()).view(ctx.shape)


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm over the last dim with gain and bias; output in x's dtype; gradients for x, weight and bias."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float):
        shape = x.shape
        x_MD = x.reshape(-1, shape[-1]).contiguous()
        w, b = weight.contiguous(), bias.contiguous()
        y, mean, rstd = layer_norm_fwd(x_MD, w, b, eps)
        ctx.save_for_backward(x_MD, w, mean, rstd)
        ctx.shape = shape
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x_MD, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_bwd(x_MD, w, mean, rstd, dy.reshape(x_MD.shape).contiguous())
        return dx.view(ctx.shape), dw, db, None
