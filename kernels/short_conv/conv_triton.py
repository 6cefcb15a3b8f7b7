"""Triton kernels of the depthwise causal short convolution (forward, backward, decode step).

Same maths and conventions as the PyTorch implementation ``conv_torch.py`` (the reference):

    pre[t, d] = bias[d] + sum_{w < W} weight[d, w] * xe[t - (W - 1) + w, d];   y = act(pre)

with ``xe`` a sequence's inputs preceded by its ``initial_state`` (the last W-1 inputs of the previous segment,
time order, rounded to x's dtype like the PyTorch path) or zeros. Positions are relative to each sequence's
start, so varlen sequences (``cu_seqlens``, B = 1) never see each other. Accumulation in fp32 (fp64 for fp64
inputs).

Kernels (all fixed configurations, so they run under ``TRITON_INTERPRET=1``; no autotuning):
- ``_fwd_kernel``, grid (row tiles, channel tiles): the W taps as W shifted ``[BT, BD]`` loads (the
  shifted rows come from L1/L2), bias, SiLU; one pass over x and y.
- ``_final_state_kernel``, grid (sequence, channel tiles): the last W-1 inputs of each sequence.
- backward, one kernel when no initial-state gradient is asked for (``BWD_FUSED``, see there):
  ``_conv_bwd_stream_kernel``, grid (row groups, channel tiles): each program walks its rows from the last to the
  first, one row a step, with the W taps and the dpre of the W-1 later rows as register windows: dpre, dx, and the
  dweight / dbias partial sums, dpre never stored.
- backward, two kernels otherwise (no gather, no recomputed halo):
  ``_dpre_kernel``, grid (row groups, channel tiles): each program walks its group in [BT, BD] row tiles; per
  tile the W shifted taps as the forward loads them (kept in registers; initial-state values before a sequence
  start), ``pre`` (the forward's order of sums), ``dpre = dy * silu'(pre)`` (one exp) stored to an fp32 buffer
  (fp64 for fp64 inputs; x's dtype with ``DPRE_IN_X_DTYPE``), and ``dweight[w] += tap_w * dpre``, ``dbias +=
  dpre`` from the same taps. Per (row group, channel) partial sums go to ``[P, D, W]`` / ``[P, D]`` buffers
  summed by ``torch.sum``: deterministic, no atomics.
  ``_dx_kernel``, grid (row tiles, channel tiles): ``dx[t] = sum_k weight[W-1-k] * dpre[t+k]`` over ``t+k``
  inside t's sequence (W shifted loads of the dpre buffer), plus the final-state gradient on each sequence's
  last W-1 rows.
- ``_dstate_kernel``, grid (sequence, channel tiles): ``d initial_state``, the dx formula at the W-1 positions
  before each sequence's start, from the dpre buffer.
- ``_update_kernel``, grid (sequence, channel tiles): one decode token per sequence, state in and a new
  state out (the input state is not modified), matching ``causal_conv1d_update``.

Shapes: x ``[B, T, D]`` (flattened to ``[NT, D]`` rows); weight ``[D, W]``; bias ``[D]``; state
``[N, D, W-1]`` (the whole-sequence kernels read a transposed copy ``[N, W-1, D]``, and the final-state
gradient likewise, so that those loads are contiguous rows like x's); decode x ``[N, D]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.colsum import column_sum

FWD_BT, FWD_BD, FWD_WARPS = 16, 128, 4  # forward: rows and channels a program, warps
# Backward launch settings: the fastest of bench_short_conv.py's sweeps on an H100 at 8 x 4096 x 2304 bf16 (session 6,
# call6: whole backward 0.476 ms vs 0.602 with the first defaults 8x128x4x32 / 32x128x8; the gather kernel 0.824).
# Kernel 1 (dpre, dweight/dbias partials): one program walks DPRE_TILES row tiles of DPRE_BT rows (256 rows: 128
# partial sums at 32768 rows); DPRE_DEFER: per-tap [BT, BD] dweight accumulators reduced over rows once per program
# (else once per tile). Kernel 1 alone 0.276 ms, kernel 2 (dx) alone 0.172 ms.
DPRE_BT, DPRE_BD, DPRE_WARPS, DPRE_TILES, DPRE_DEFER = 4, 128, 4, 64, True
DPRE_IN_X_DTYPE = False  # store dpre in x's dtype (bf16: 2 B less traffic per element each way) instead of fp32
DX_BT, DX_BD, DX_WARPS = 16, 256, 4
# One backward kernel instead of the two when no initial-state gradient is asked for (the training layer's case), so
# that dpre never reaches DRAM (6 B an element of traffic in bf16 against 14; False: always the two kernels, as when
# the initial state needs a gradient, whose kernel reads the dpre buffer): one row a step per program, the W taps and
# the W-1 later rows' dpre carried in registers as sliding windows (no shifted loads, no scratch, no barriers);
# STREAM_ROWS rows a program (plus the W-1 after them, whose dpre is recomputed), STREAM_BD channels, STREAM_WARPS
# warps, STREAM_STAGES stages. H200, the model's 8 x 4096 x 2304 bf16 backward (bench_short_conv.py, session 28
# call6): two kernels 0.395 ms, this 0.271 at 128 rows (0.278 at 256, 0.418 at 512, 0.52 at 64 channels); the small
# hybrid's step: 3.41 -> 2.29 ms of backward conv kernels. Tried and removed (calls 4-6): the same from [BT, BD]
# row tiles with dpre through a per-program ring of BT + W-1 rows in L2-resident scratch, two barriers a tile (0.302-
# 0.369 ms over 5 tile settings; 2.68 ms a step).
BWD_FUSED = True
STREAM_ROWS, STREAM_BD, STREAM_WARPS, STREAM_STAGES = 128, 128, 1, 3
# Session 33 (call1, same shape) tried the loop over STEP rows an iteration with all their x / dy loads issued before the
# first row's arithmetic (more loads in flight a warp): 0.258 / 0.270 / 0.317 / 0.396 ms at 1 / 2 / 4 / 8 rows (122 /
# 144 / 221 / 255 registers: fewer warps an SM); removed.
STATE_BD = 128
DEC_BD = 256
NUM_WARPS = 4


@triton.jit
def _rows_seq(rows, rmask, seq_ptr, cu_ptr, T, VARLEN: tl.constexpr):
    """Sequence id, first flattened row and length of each row's sequence (int64 vectors)."""
    if VARLEN:
        seq = tl.load(seq_ptr + rows, mask=rmask, other=0).to(tl.int64)
        bos = tl.load(cu_ptr + seq, mask=rmask, other=0).to(tl.int64)
        L = tl.load(cu_ptr + seq + 1, mask=rmask, other=0).to(tl.int64) - bos
    else:
        seq = rows // T
        bos = seq * T
        L = tl.zeros_like(rows) + T
    return seq, bos, L


@triton.jit
def _seq_span(n, j, cu_ptr, T, VARLEN: tl.constexpr):
    """Sequence n's id, first row and length broadcast to the shape of ``j`` (int64 vectors)."""
    seq = tl.zeros_like(j).to(tl.int64) + n
    if VARLEN:
        bos = tl.load(cu_ptr + seq).to(tl.int64)
        L = tl.load(cu_ptr + seq + 1).to(tl.int64) - bos
    else:
        bos = seq * T
        L = tl.zeros_like(seq) + T
    return seq, bos, L


@triton.jit
def _tap(x_ptr, s_ptr, seq, bos, p, pmin, rmask, cols, cmask, D, W: tl.constexpr, HAS_STATE: tl.constexpr,
         ACC: tl.constexpr):
    """Input at sequence position ``p`` ([BR]) for channels ``cols``: x, the initial state before the start
    (rounded to x's dtype), or zero. ``pmin`` (scalar) <= min(p): the strided state gather is skipped for
    tiles with no row before a sequence start. Returns ``[BR, BD]`` in ACC."""
    m = (rmask & (p >= 0))[:, None] & cmask[None, :]
    v = tl.load(x_ptr + (bos + p)[:, None] * D + cols[None, :], mask=m, other=0.0).to(ACC)
    if HAS_STATE:
        if pmin < 0:
            j = p + (W - 1)
            ms = (rmask & (p < 0) & (j >= 0))[:, None] & cmask[None, :]
            s = tl.load(s_ptr + (seq * (W - 1) + j)[:, None] * D + cols[None, :], mask=ms, other=0.0)
            v += s.to(x_ptr.dtype.element_ty).to(ACC)
    return v


@triton.jit
def _pre(x_ptr, w_ptr, b_ptr, s_ptr, seq, bos, pos, pmin, rmask, cols, cmask, D, W: tl.constexpr, BR: tl.constexpr,
         BD: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr, ACC: tl.constexpr):
    """Pre-activation ``[BR, BD]`` at sequence positions ``pos`` (``pmin`` <= min(pos))."""
    acc = tl.zeros([BR, BD], dtype=ACC)
    for w in tl.static_range(W):
        wt = tl.load(w_ptr + cols * W + w, mask=cmask, other=0.0).to(ACC)
        tap = _tap(x_ptr, s_ptr, seq, bos, pos - (W - 1) + w, pmin - (W - 1) + w, rmask, cols, cmask, D, W,
                   HAS_STATE, ACC)
        acc += wt[None, :] * tap
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(ACC)[None, :]
    return acc


@triton.jit
def _silu(pre):
    return pre / (1.0 + tl.exp(-pre))


@triton.jit
def _fwd_kernel(x_ptr, w_ptr, b_ptr, s_ptr, y_ptr, seq_ptr, cu_ptr, NT, T, D, W: tl.constexpr, BT: tl.constexpr,
                BD: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr,
                VARLEN: tl.constexpr, ACC: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    rmask, cmask = rows < NT, cols < D
    seq, bos, L = _rows_seq(rows, rmask, seq_ptr, cu_ptr, T, VARLEN)
    pos = rows - bos
    pre = _pre(x_ptr, w_ptr, b_ptr, s_ptr, seq, bos, pos, tl.min(pos, axis=0), rmask, cols, cmask, D, W, BT, BD,
               HAS_BIAS, HAS_STATE, ACC)
    y = _silu(pre) if ACT else pre
    m = rmask[:, None] & cmask[None, :]
    tl.store(y_ptr + rows[:, None] * D + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _final_state_kernel(x_ptr, s_ptr, fs_ptr, cu_ptr, T, D, W: tl.constexpr, BJ: tl.constexpr, BD: tl.constexpr,
                        HAS_STATE: tl.constexpr, VARLEN: tl.constexpr, ACC: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    j = tl.arange(0, BJ).to(tl.int64)
    jm = j < W - 1
    seq, bos, L = _seq_span(n, j, cu_ptr, T, VARLEN)
    v = _tap(x_ptr, s_ptr, seq, bos, L - (W - 1) + j, -1, jm, cols, cmask, D, W, HAS_STATE, ACC)
    off = n * D * (W - 1) + cols[None, :] * (W - 1) + j[:, None]
    tl.store(fs_ptr + off, v.to(fs_ptr.dtype.element_ty), mask=jm[:, None] & cmask[None, :])


@triton.jit
def _dpre_kernel(x_ptr, w_ptr, b_ptr, s_ptr, dy_ptr, dpre_ptr, dw_ptr, db_ptr, seq_ptr, cu_ptr, NT, T, D,
                 W: tl.constexpr, BW: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, TILES: tl.constexpr,
                 DEFER: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr,
                 VARLEN: tl.constexpr, ACC: tl.constexpr):
    """Backward kernel 1, one program: TILES consecutive [BT, BD] row tiles. Per tile the W shifted taps (as the
    forward loads them, kept in registers), ``pre`` (same order of sums as the forward), ``dpre = dy * silu'(pre)``
    (stored), and the dweight / dbias terms ``tap_w * dpre`` from the same taps. DEFER: per-tap [BT, BD]
    accumulators reduced over rows once per program, else one row reduction per tap and tile. The program's
    partial sums go to ``dw_ptr[program, d, w]`` / ``db_ptr[program, d]``."""
    i_p = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    wc = tl.arange(0, BW)
    dw = tl.zeros([BW, BD], dtype=ACC)  # dw[w, d]: transposed, so that its rows are the tile's column vectors
    db = tl.zeros([BD], dtype=ACC)
    wts = ()  # the weights, loaded once per program
    acc = ()  # DEFER: per-tap partial sums of tap * dpre, [BT, BD] each
    for w in tl.static_range(W):
        wts = wts + (tl.load(w_ptr + cols * W + w, mask=cmask, other=0.0),)
        acc = acc + (tl.zeros([BT if DEFER else 1, BD], dtype=ACC),)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(ACC)
    gsum = tl.zeros([BT if DEFER else 1, BD], dtype=ACC)
    for it in range(TILES):
        rows = (i_p * TILES + it) * BT + tl.arange(0, BT)
        rmask = rows < NT
        seq, bos, L = _rows_seq(rows, rmask, seq_ptr, cu_ptr, T, VARLEN)
        pos = rows - bos
        pmin = tl.min(pos, axis=0)
        m = rmask[:, None] & cmask[None, :]
        g = tl.load(dy_ptr + rows[:, None] * D + cols[None, :], mask=m, other=0.0).to(ACC)
        taps = ()  # in x's dtype (exact), converted where used: fewer registers
        for w in tl.static_range(W):
            taps = taps + (_tap(x_ptr, s_ptr, seq, bos, pos - (W - 1) + w, pmin - (W - 1) + w, rmask, cols, cmask,
                                D, W, HAS_STATE, x_ptr.dtype.element_ty),)
        if ACT:
            pre = tl.zeros([BT, BD], dtype=ACC)
            for w in tl.static_range(W):
                pre += wts[w].to(ACC)[None, :] * taps[w].to(ACC)
            if HAS_BIAS:
                pre += bias[None, :]
            sig = 1.0 / (1.0 + tl.exp(-pre))
            g = g * sig * (1.0 + pre * (1.0 - sig))
        tl.store(dpre_ptr + rows[:, None] * D + cols[None, :], g.to(dpre_ptr.dtype.element_ty), mask=m)
        if DEFER:
            nxt = ()
            for w in tl.static_range(W):
                nxt = nxt + (acc[w] + taps[w].to(ACC) * g,)
            acc = nxt
            gsum += g
        else:
            for w in tl.static_range(W):
                dw += tl.where(wc[:, None] == w, tl.sum(taps[w].to(ACC) * g, axis=0)[None, :], 0.0)
            db += tl.sum(g, axis=0)
    if DEFER:
        for w in tl.static_range(W):
            dw += tl.where(wc[:, None] == w, tl.sum(acc[w], axis=0)[None, :], 0.0)
        db = tl.sum(gsum, axis=0)
    w_off = i_p * D * W + cols[None, :] * W + wc[:, None]
    tl.store(dw_ptr + w_off, dw, mask=(wc < W)[:, None] & cmask[None, :])
    if HAS_BIAS:
        tl.store(db_ptr + i_p * D + cols, db, mask=cmask)


@triton.jit
def _dx_kernel(dpre_ptr, w_ptr, dfs_ptr, dx_ptr, seq_ptr, cu_ptr, NT, T, D, W: tl.constexpr, BT: tl.constexpr,
               BD: tl.constexpr, HAS_DFS: tl.constexpr, VARLEN: tl.constexpr, ACC: tl.constexpr):
    """Backward kernel 2: ``dx[t] = sum_k weight[W-1-k] * dpre[t+k]`` over t+k inside t's sequence (W shifted
    [BT, BD] loads of dpre), plus the final-state gradient on each sequence's last W-1 rows."""
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    rmask, cmask = rows < NT, cols < D
    seq, bos, L = _rows_seq(rows, rmask, seq_ptr, cu_ptr, T, VARLEN)
    pos = rows - bos
    dx = tl.zeros([BT, BD], dtype=ACC)
    for k in tl.static_range(W):
        wt = tl.load(w_ptr + cols * W + (W - 1 - k), mask=cmask, other=0.0).to(ACC)
        mk = (rmask & (pos + k < L))[:, None] & cmask[None, :]
        dx += wt[None, :] * tl.load(dpre_ptr + (rows + k)[:, None] * D + cols[None, :], mask=mk, other=0.0).to(ACC)
    if HAS_DFS:
        dx += _dfs_rows(dfs_ptr, seq, pos, L, rmask, cols, cmask, D, W, ACC)
    tl.store(dx_ptr + rows[:, None] * D + cols[None, :], dx.to(dx_ptr.dtype.element_ty),
             mask=rmask[:, None] & cmask[None, :])


@triton.jit
def _conv_bwd_stream_kernel(x_ptr, w_ptr, b_ptr, s_ptr, dy_ptr, dfs_ptr, dx_ptr, dw_ptr, db_ptr, seq_ptr, cu_ptr, NT, T,
                            D, W: tl.constexpr, BW: tl.constexpr, ROWS: tl.constexpr, BD: tl.constexpr,
                            ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr,
                            HAS_DFS: tl.constexpr, VARLEN: tl.constexpr, ACC: tl.constexpr):
    """The whole backward but d initial state, one program: rows ``[g0, g0 + ROWS)`` from the last to the first,
    one row a step, for BD channels. ``xs`` holds the inputs of rows t-W+1..t (raw rows; a tap before t's sequence
    start is replaced by the initial state or zero where used), ``ds`` the dpre of rows t+1..t+W-1 (each used only
    inside t's sequence); the W-1 rows after the group are stepped through first (dpre only)."""
    i_p = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    zc = (cols * 0).to(tl.int64)  # row scalars as vectors over the channels: masks stay vectors (the interpreter
    # turns a scalar bool & a vector bool into integers, which tl.load refuses as a mask)
    wc = tl.arange(0, BW)
    g0 = i_p * ROWS
    g1 = tl.minimum(g0 + ROWS, NT)
    wts = ()
    dws = ()
    xs = ()  # xs[j]: x row t - (W - 1) + j
    ds = ()  # ds[k]: dpre row t + 1 + k
    top = g1 + (W - 2)  # the first row stepped: the last of the W-1 after the group
    for w in tl.static_range(W):
        wts = wts + (tl.load(w_ptr + cols * W + w, mask=cmask, other=0.0).to(ACC),)
        dws = dws + (tl.zeros([BD], dtype=ACC),)
        r0 = top - (W - 1) + 1 + w  # xs for t = top + 1, shifted in at the first step
        xs = xs + (tl.load(x_ptr + r0 * D + cols, mask=cmask & (zc + r0 >= 0) & (zc + r0 < NT), other=0.0).to(ACC),)
    for _k in tl.static_range(W - 1):
        ds = ds + (tl.zeros([BD], dtype=ACC),)
    db = tl.zeros([BD], dtype=ACC)
    bias = tl.zeros([BD], dtype=ACC)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(ACC)
    for i in range(ROWS + W - 1):
        t = top - i
        r = t - (W - 1)
        tv = zc + t
        rv = tv - (W - 1)
        nx = (tl.load(x_ptr + r * D + cols, mask=cmask & (rv >= 0) & (rv < NT), other=0.0).to(ACC),)
        for j in tl.static_range(W - 1):
            nx = nx + (xs[j],)
        xs = nx
        ok = cmask & (tv >= g0) & (tv < NT)
        mine = ok & (tv < g1)  # a row of this group (else one of the W-1 after it)
        if VARLEN:
            seq = tl.load(seq_ptr + tl.maximum(tl.minimum(t, NT - 1), 0)).to(tl.int64)
            bos = tl.load(cu_ptr + seq).to(tl.int64)
            L = tl.load(cu_ptr + seq + 1).to(tl.int64) - bos
        else:
            seq = t // T
            bos = seq * T
            L = T
        pos = zc + (t - bos)
        g = tl.load(dy_ptr + t * D + cols, mask=ok, other=0.0).to(ACC)
        taps = ()
        for j in tl.static_range(W):
            tap = tl.where(pos - (W - 1) + j >= 0, xs[j], 0.0)
            if HAS_STATE:
                sj = pos + j  # state column of a tap before the start
                tap += tl.load(s_ptr + (seq * (W - 1) + sj) * D + cols,
                               mask=ok & (sj < W - 1), other=0.0).to(x_ptr.dtype.element_ty).to(ACC)
            taps = taps + (tap,)
        if ACT:  # (the forward's order of sums)
            pre = tl.zeros([BD], dtype=ACC)
            for j in tl.static_range(W):
                pre += wts[j] * taps[j]
            pre += bias
            sig = 1.0 / (1.0 + tl.exp(-pre))
            g = g * sig * (1.0 + pre * (1.0 - sig))
        dx = wts[W - 1] * g
        for k in tl.static_range(W - 1):
            dx += tl.where(pos + 1 + k < L, wts[W - 2 - k] * ds[k], 0.0)
        if HAS_DFS:
            c = pos - L + (W - 1)  # final-state column that holds this input
            dx += tl.load(dfs_ptr + (seq * (W - 1) + c) * D + cols, mask=ok & (c >= 0), other=0.0).to(ACC)
        tl.store(dx_ptr + t * D + cols, dx.to(dx_ptr.dtype.element_ty), mask=mine)
        gm = tl.where(mine, g, 0.0)
        nxt = ()
        for j in tl.static_range(W):
            nxt = nxt + (dws[j] + taps[j] * gm,)
        dws = nxt
        db += gm
        nd = (g,)
        for k in tl.static_range(W - 2):
            nd = nd + (ds[k],)
        ds = nd
    dw = tl.zeros([BW, BD], dtype=ACC)
    for w in tl.static_range(W):
        dw += tl.where(wc[:, None] == w, dws[w][None, :], 0.0)
    tl.store(dw_ptr + i_p * D * W + cols[None, :] * W + wc[:, None], dw, mask=(wc < W)[:, None] & cmask[None, :])
    if HAS_BIAS:
        tl.store(db_ptr + i_p * D + cols, db, mask=cmask)


@triton.jit
def _dfs_rows(dfs_ptr, seq, pos, L, rmask, cols, cmask, D, W: tl.constexpr, ACC: tl.constexpr):
    """Final-state gradient of the inputs at sequence positions ``pos`` (zero outside the last W-1)."""
    c = pos - L + (W - 1)  # final-state column that holds this input
    m = (rmask & (c >= 0))[:, None] & cmask[None, :]
    return tl.load(dfs_ptr + (seq * (W - 1) + c)[:, None] * D + cols[None, :], mask=m, other=0.0).to(ACC)


@triton.jit
def _dstate_kernel(dpre_ptr, w_ptr, dfs_ptr, ds_ptr, cu_ptr, T, D, W: tl.constexpr, BJ: tl.constexpr,
                   BD: tl.constexpr, HAS_DFS: tl.constexpr, VARLEN: tl.constexpr, ACC: tl.constexpr):
    """``d initial_state``: the dx formula at the W-1 positions before each sequence's start, from dpre."""
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    j = tl.arange(0, BJ).to(tl.int64)
    jm = j < W - 1
    seq, bos, L = _seq_span(n, j, cu_ptr, T, VARLEN)
    p = j - (W - 1)  # sequence position of state column j
    acc = tl.zeros([BJ, BD], dtype=ACC)
    for k in tl.static_range(1, W):
        wt = tl.load(w_ptr + cols * W + (W - 1 - k), mask=cmask, other=0.0).to(ACC)
        mk = (jm & (p + k >= 0) & (p + k < L))[:, None] & cmask[None, :]
        acc += wt[None, :] * tl.load(dpre_ptr + (bos + p + k)[:, None] * D + cols[None, :], mask=mk,
                                     other=0.0).to(ACC)
    if HAS_DFS:
        acc += _dfs_rows(dfs_ptr, seq, p, L, jm, cols, cmask, D, W, ACC)
    off = n * D * (W - 1) + cols[None, :] * (W - 1) + j[:, None]
    tl.store(ds_ptr + off, acc.to(ds_ptr.dtype.element_ty), mask=jm[:, None] & cmask[None, :])


@triton.jit
def _update_kernel(x_ptr, s_ptr, w_ptr, b_ptr, y_ptr, ns_ptr, D, W: tl.constexpr, BJ: tl.constexpr,
                   BD: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, ACC: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    j = tl.arange(0, BJ)
    jm = j < W - 1
    m2 = cmask[:, None] & jm[None, :]
    x_raw = tl.load(x_ptr + n * D + cols, mask=cmask, other=0.0)
    s_base = s_ptr + n * D * (W - 1) + cols[:, None] * (W - 1)
    s = tl.load(s_base + j[None, :], mask=m2, other=0.0).to(x_ptr.dtype.element_ty)
    ws = tl.load(w_ptr + cols[:, None] * W + j[None, :], mask=m2, other=0.0).to(ACC)
    w_last = tl.load(w_ptr + cols * W + (W - 1), mask=cmask, other=0.0).to(ACC)
    acc = tl.sum(s.to(ACC) * ws, axis=1) + x_raw.to(ACC) * w_last
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(ACC)
    y = _silu(acc) if ACT else acc
    tl.store(y_ptr + n * D + cols, y.to(y_ptr.dtype.element_ty), mask=cmask)
    nxt = tl.load(s_base + j[None, :] + 1, mask=cmask[:, None] & (j + 1 < W - 1)[None, :], other=0.0)
    nxt = tl.where((j == W - 2)[None, :], x_raw[:, None], nxt.to(x_ptr.dtype.element_ty))
    ns_off = n * D * (W - 1) + cols[:, None] * (W - 1) + j[None, :]
    tl.store(ns_ptr + ns_off, nxt.to(ns_ptr.dtype.element_ty), mask=m2)


@dataclass(frozen=True)
class _Layout:
    NT: int  # flattened rows B * T
    T: int
    D: int
    W: int
    N: int  # sequences
    varlen: bool
    seq: torch.Tensor  # [NT] int32 sequence id per row (varlen), else a 1-element dummy
    cu: torch.Tensor  # [N + 1] int32 (varlen), else a 1-element dummy


def _layout(B: int, T: int, D: int, W: int, cu_seqlens: torch.Tensor | None, device: torch.device) -> _Layout:
    if cu_seqlens is None:
        dummy = torch.empty(1, dtype=torch.int32, device=device)  # never read without varlen
        return _Layout(B * T, T, D, W, B, False, dummy, dummy)
    cu = cu_seqlens.to(device=device, dtype=torch.int32).contiguous()
    N = cu.numel() - 1
    lens = (cu[1:] - cu[:-1]).long()
    seq = torch.repeat_interleave(torch.arange(N, dtype=torch.int32, device=device), lens, output_size=T)
    return _Layout(T, T, D, W, N, True, seq if T else cu, cu)


def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _bj(W: int) -> int:
    return max(2, triton.next_power_of_2(max(W - 1, 1)))


def _forward(x_TD, w, b, s, lay: _Layout, silu: bool, shape: tuple[int, ...]) -> torch.Tensor:
    """y in ``shape`` (x's ``[B, T, D]``), allocated as such: not a view, so that views of y have y as their base
    (``kernels.kda.prep_triton.qkv_base`` finds the q|k|v tensor that way)."""
    y = torch.empty(shape, dtype=x_TD.dtype, device=x_TD.device)
    if lay.NT == 0 or lay.D == 0:
        return y
    grid = (triton.cdiv(lay.NT, FWD_BT), triton.cdiv(lay.D, FWD_BD))
    _fwd_kernel[grid](
        x_TD, w, b if b is not None else w, s if s is not None else x_TD, y, lay.seq, lay.cu, lay.NT, lay.T, lay.D,
        W=lay.W, BT=FWD_BT, BD=FWD_BD, ACT=silu, HAS_BIAS=b is not None, HAS_STATE=s is not None,
        VARLEN=lay.varlen, ACC=_acc(x_TD.dtype), num_warps=FWD_WARPS,
    )
    return y


def _final_state(x_TD, s, lay: _Layout, out_dt: torch.dtype) -> torch.Tensor:
    fs = torch.empty(lay.N, lay.D, lay.W - 1, dtype=out_dt, device=x_TD.device)
    if fs.numel() == 0:
        return fs
    grid = (lay.N, triton.cdiv(lay.D, STATE_BD))
    _final_state_kernel[grid](
        x_TD, s if s is not None else x_TD, fs, lay.cu, lay.T, lay.D, W=lay.W, BJ=_bj(lay.W), BD=STATE_BD,
        HAS_STATE=s is not None, VARLEN=lay.varlen, ACC=_acc(x_TD.dtype), num_warps=NUM_WARPS,
    )
    return fs


def _partials(n_prog: int, lay: _Layout, acc_dt: torch.dtype, bias: bool, device: torch.device):
    """The dweight ``[P, D, W]`` / dbias ``[P, D]`` (or None) partial-sum buffers of P programs: every program writes
    all of its rows, so they start empty."""
    dw_part = torch.empty(n_prog, lay.D, lay.W, dtype=acc_dt, device=device)
    return dw_part, (torch.empty(n_prog, lay.D, dtype=acc_dt, device=device) if bias else None)


def _bwd_dpre(x_TD, w, b, s, dy_TD, lay: _Layout, silu: bool):
    """Kernel 1: dpre ``[NT, D]`` (fp32/fp64, or x's dtype with ``DPRE_IN_X_DTYPE``) and the dweight
    ``[P, D, W]`` / dbias ``[P, D]`` partial sums of its P row-group programs (dbias None without bias)."""
    acc_dt = torch.float64 if x_TD.dtype == torch.float64 else torch.float32
    dpre = torch.empty(lay.NT, lay.D, dtype=x_TD.dtype if DPRE_IN_X_DTYPE else acc_dt, device=x_TD.device)
    tiles = max(1, min(DPRE_TILES, triton.cdiv(lay.NT, DPRE_BT)))
    n_prog = triton.cdiv(lay.NT, DPRE_BT * tiles)
    dw_part, db_part = _partials(n_prog, lay, acc_dt, b is not None, x_TD.device)
    if n_prog and lay.D:
        _dpre_kernel[(n_prog, triton.cdiv(lay.D, DPRE_BD))](
            x_TD, w, b if b is not None else w, s if s is not None else x_TD, dy_TD, dpre, dw_part,
            db_part if db_part is not None else dw_part, lay.seq, lay.cu, lay.NT, lay.T, lay.D, W=lay.W,
            BW=max(2, triton.next_power_of_2(lay.W)), BT=DPRE_BT, BD=DPRE_BD, TILES=tiles, DEFER=DPRE_DEFER,
            ACT=silu, HAS_BIAS=b is not None, HAS_STATE=s is not None, VARLEN=lay.varlen, ACC=_acc(x_TD.dtype),
            num_warps=DPRE_WARPS,
        )
    return dpre, dw_part, db_part


def _bwd_dx(dpre, w, dfs, lay: _Layout, out_dt: torch.dtype) -> torch.Tensor:
    """Kernel 2: dx ``[NT, D]`` in ``out_dt`` from dpre and the final-state gradient ``[N, W-1, D]`` (or None)."""
    dx = torch.empty(lay.NT, lay.D, dtype=out_dt, device=dpre.device)
    if lay.NT and lay.D:
        _dx_kernel[(triton.cdiv(lay.NT, DX_BT), triton.cdiv(lay.D, DX_BD))](
            dpre, w, dfs if dfs is not None else dpre, dx, lay.seq, lay.cu, lay.NT, lay.T, lay.D, W=lay.W, BT=DX_BT,
            BD=DX_BD, HAS_DFS=dfs is not None, VARLEN=lay.varlen, ACC=_acc(out_dt), num_warps=DX_WARPS,
        )
    return dx


def _bwd_stream(x_TD, w, b, s, dy_TD, dfs, lay: _Layout, silu: bool):
    """``_conv_bwd_stream_kernel``: dx ``[NT, D]`` in x's dtype and the dweight ``[P, D, W]`` / dbias ``[P, D]``
    partial sums of its P row-group programs (dbias None without bias)."""
    acc_dt = torch.float64 if x_TD.dtype == torch.float64 else torch.float32
    n_prog, n_col = triton.cdiv(lay.NT, STREAM_ROWS), triton.cdiv(lay.D, STREAM_BD)
    dx = torch.empty(lay.NT, lay.D, dtype=x_TD.dtype, device=x_TD.device)
    dw_part, db_part = _partials(n_prog, lay, acc_dt, b is not None, x_TD.device)
    if n_prog and lay.D:
        _conv_bwd_stream_kernel[(n_prog, n_col)](
            x_TD, w, b if b is not None else w, s if s is not None else x_TD, dy_TD, dfs if dfs is not None else dx,
            dx, dw_part, db_part if db_part is not None else dw_part, lay.seq, lay.cu, lay.NT, lay.T, lay.D, W=lay.W,
            BW=max(2, triton.next_power_of_2(lay.W)), ROWS=STREAM_ROWS, BD=STREAM_BD, ACT=silu,
            HAS_BIAS=b is not None, HAS_STATE=s is not None, HAS_DFS=dfs is not None, VARLEN=lay.varlen,
            ACC=_acc(x_TD.dtype), num_warps=STREAM_WARPS, num_stages=STREAM_STAGES,
        )
    return dx, dw_part, db_part


def _backward(x_TD, w, b, s, dy_TD, dfs, lay: _Layout, silu: bool, need_dpre: bool = True):
    """dx ``[NT, D]``, dweight ``[D, W]`` and dbias ``[D]`` (fp32/fp64 sums over the programs' partials, in the
    weight's and bias's dtypes; dbias None without bias), and dpre
    (for ``_dstate``; None from the one-kernel backward, taken when ``need_dpre`` is False, ``BWD_FUSED`` is set
    and W > 1)."""
    if not need_dpre and BWD_FUSED and lay.W > 1:
        dx, dw_part, db_part = _bwd_stream(x_TD, w, b, s, dy_TD, dfs, lay, silu)
        dpre = None
    else:
        dpre, dw_part, db_part = _bwd_dpre(x_TD, w, b, s, dy_TD, lay, silu)
        dx = _bwd_dx(dpre, w, dfs, lay, x_TD.dtype)
    return dx, column_sum(dw_part, w.dtype), (column_sum(db_part, b.dtype) if db_part is not None else None), dpre


def _dstate(dpre, w, dfs, lay: _Layout, out_dt: torch.dtype) -> torch.Tensor:
    ds = torch.zeros(lay.N, lay.D, lay.W - 1, dtype=out_dt, device=dpre.device)
    if ds.numel() == 0:
        return ds
    _dstate_kernel[(lay.N, triton.cdiv(lay.D, STATE_BD))](
        dpre, w, dfs if dfs is not None else dpre, ds, lay.cu, lay.T, lay.D, W=lay.W, BJ=_bj(lay.W), BD=STATE_BD,
        HAS_DFS=dfs is not None, VARLEN=lay.varlen, ACC=_acc(dpre.dtype),
        num_warps=NUM_WARPS,
    )
    return ds


class CausalConv1dFunction(torch.autograd.Function):
    """Autograd wrapper: gradients for x, weight, bias and initial_state (through y and the final state)."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_state, cu_seqlens, silu: bool, output_final_state: bool):
        B, T, D = x.shape
        lay = _layout(B, T, D, weight.shape[1], cu_seqlens, x.device)
        x_TD = x.reshape(B * T, D).contiguous()
        w = weight.contiguous()
        b = bias.contiguous() if bias is not None else None
        # the kernels read the state (and the final-state gradient) as [N, W-1, D]: contiguous rows like x's
        s = initial_state.transpose(1, 2).contiguous() if initial_state is not None and lay.W > 1 else None
        y = _forward(x_TD, w, b, s, lay, silu, (B, T, D))
        s_dt = initial_state.dtype if initial_state is not None else x.dtype
        fs = _final_state(x_TD, s, lay, s_dt) if output_final_state else None
        ctx.save_for_backward(x_TD, w, b, s)
        ctx.lay, ctx.silu, ctx.shape = lay, silu, (B, T, D)
        ctx.state_dtype = s_dt
        return y, fs

    @staticmethod
    def backward(ctx, dy, dfs):
        x_TD, w, b, s = ctx.saved_tensors
        lay, silu = ctx.lay, ctx.silu
        dy_TD = dy.reshape(lay.NT, lay.D).contiguous() if dy is not None else torch.zeros_like(x_TD)
        dfs = dfs.transpose(1, 2).contiguous() if dfs is not None and dfs.numel() else None
        need_ds = ctx.needs_input_grad[3] and s is not None
        dx, dw, db, dpre = _backward(x_TD, w, b, s, dy_TD, dfs, lay, silu, need_dpre=need_ds)
        ds = None
        if ctx.needs_input_grad[3]:
            if s is not None:
                ds = _dstate(dpre, w, dfs, lay, ctx.state_dtype)
            else:  # W = 1: the state is empty
                ds = torch.zeros(lay.N, lay.D, 0, dtype=ctx.state_dtype, device=x_TD.device)
        return dx.view(ctx.shape), dw, db, ds, None, None, None


def causal_conv1d_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
    cu_seqlens: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x ``[B, T, D]`` -> y ``[B, T, D]`` (x's dtype) and the final state ``[N, D, W-1]`` when asked."""
    return CausalConv1dFunction.apply(x, weight, bias, initial_state, cu_seqlens, silu, output_final_state)


def causal_conv1d_update_triton(
    x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode step (forward only): x ``[N, D]``, state ``[N, D, W-1]`` -> y ``[N, D]``, new state."""
    N, D = x.shape
    W = weight.shape[1]
    x = x.contiguous()
    s = state.contiguous() if W > 1 else x  # W = 1: an empty state, never read
    y = torch.empty_like(x)
    ns = torch.empty(N, D, W - 1, dtype=state.dtype, device=state.device)
    if N and D:
        w = weight.contiguous()
        _update_kernel[(N, triton.cdiv(D, DEC_BD))](
            x, s, w, bias.contiguous() if bias is not None else w, y, ns if W > 1 else y, D, W=W, BJ=_bj(W), BD=DEC_BD, ACT=silu,
            HAS_BIAS=bias is not None, ACC=_acc(x.dtype), num_warps=NUM_WARPS,
        )
    return y, ns
