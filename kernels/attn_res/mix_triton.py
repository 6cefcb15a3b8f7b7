"""Fused Triton kernels for the Attention-Residual mix over depth, forward and backward (GPU; also runs under
``TRITON_INTERPRET=1``). Maths of ``naive.py`` (the spec), gradients as in ``mix_torch.py``.

Shapes: ``M`` tokens (all leading dims flattened), ``D`` features, ``N`` sources ``x_n [M, D]`` (contiguous,
one dtype: fp32, fp16 or bf16), read in place through a table of their addresses (``int64 [N]``), so the
sources are never stacked and one compiled kernel serves every ``N`` (when every address is 16-byte aligned,
``ALIGNED`` tells the compiler so, since it cannot see through the table, and loads vectorise).

- Forward: one program per tile of ``BLOCK_T`` tokens x all of ``D`` walks the sources once with an online
  softmax: per source, RMS and score in fp32, then ``acc = acc * e^(m - m') + e^(s - m') x``. Writes
  ``h [M, D]``, fp32 ``rstd [N, M]`` and ``alpha = exp(s - m) / l [N, M]`` (saved for backward, returned for
  diagnostics; no log: ``exp(s - lse)`` with the GPU's approximate log gave alpha a few ulp below 1 for one source,
  H200, session 23). The pointer-argument forward uses the backward's layout (below: warp-owned rows of ``CH``
  chunks, ``N`` a compile-time constant, the next ``FWD_PREFETCH`` sources' tiles loaded before the current one is
  used; the ``FWD_*`` constants) and keeps the ``N`` scores in registers until the softmax's max and sum are known
  (session 22; before, both forwards wrote the scores and ``lse`` and the wrapper took two more launches for
  ``alpha``). The address-table forward (any ``N``) stores the scores into alpha's buffer and rewrites them at the
  end (session 23; before, ``lse`` and two launches in the wrapper). It keeps
  the first layout, ``BLOCK_D`` = the next power of two of ``D`` (``D = 768`` pads to 1024) with reductions across
  the program's warps. Measured on an H100 (session 12, ``bench_attnres --bwd-sweep``, M = 32768, D = 768, bf16):
  the row layout took 0.070 / 0.085 / 0.124 / 0.133 ms at N = 2 / 3 / 4 / 5 against 0.105 / 0.129 / 0.161 /
  0.192 ms for the first layout through pointer arguments (~1.5 TB/s -> ~2.2 TB/s), and the small model's app
  step at batch 16 x 4096 took 0.947 and 0.943 of the time (two interleaved rounds), so that layout was removed
  from the pointer-argument path.
- Backward: grid-stride over token tiles of ``BLOCK_T`` rows; a row is ``CH`` column chunks of ``CHUNK`` (one
  warp's width of 16-byte vectors or more, ``CH <= BWD_MAX_CHUNKS``), so each warp owns whole rows: the per-token
  dot products are warp shuffles (no shared memory, no barrier inside the loop) and ``D = 768`` is 3 x 256 with
  no padding. Per token ``g_n = dh . x_n``, ``q_n = u . x_n`` (pass A, one read of each source) give
  ``ds_n = alpha_n (g_n - sum_j alpha_j g_j)``, the score ``s_n = q_n rstd_n`` and, in pass B (no reductions),
  ``dx_n = alpha_n dh + ds_n rstd_n (u - x_n rstd_n s_n / D)``. Pass B's code loads the tiles again, but the
  compiler merges those loads with pass A's (the pointer-argument kernel's PTX for sm_90a has one load per
  tile and source, Triton 3.9, session 23), so the tiles stay in registers. The query gradient
  ``du = sum ds_n rstd_n x_n`` is accumulated per program in fp32 registers and the per-program rows are summed
  afterwards by a column-sum kernel (no atomics, deterministic). The pointer-argument kernel is compiled per ``N``
  (straight-line code; the next ``BWD_PREFETCH`` sources' tiles are loaded before the current one is used: all of
  them by default, which took the H200's forward from 0.096 to 0.079 ms and the backward from 0.179 to 0.166 ms at
  N = 4, M = 32768, D = 768, session 20 call8). ``h`` is not rebuilt:
  the ``dh . (x_n - h)`` form of the first kernels avoided no error that matters (on sources sharing a component
  100x their spread both forms, and the PyTorch function, lose comparable digits of the query gradient in fp32:
  ``test_triton_common_offset_sources``).
  The tile loop is software-pipelined (``BWD_STAGES``, :func:`bwd_stages`: the next tile's sources and ``dh`` go to
  shared memory by ``cp.async`` during this one; H200, session 31: 0.110 -> 0.107 ms at N = 3, 0.183 -> 0.165 at 5).
  This layout replaced a first backward (h rebuilt, per-source branches, cross-warp reductions; 161 registers):
  the small model's 24 backward mixes 17.27 -> 6.54 ms a step, 4 warps better than 8 (H100, session 6).

A block-level option of the backward (``kimi_vl/modeling/attn_res.py`` switches it):

- Deferred gradients (``mix_autograd.DeferredBlock``, ``DEFER`` bits of the backward, ``_attn_res_flush_kernel``): the
  mixes of a block store per-token coefficients for the block states they share instead of adding ``dx`` into
  each state's :class:`GradSink`, and the block's first mix forms every state's gradient once (on by default;
  session 12, H100: the small model's backward mixes 5.71 -> 3.14 ms a step, plus 1.27 ms of flushes). The flush
  kernel takes ``FLUSH_GROUP`` states per pass over the mixes, loading each mix's ``dh`` once a pass (H200, session
  22: 6 mixes into 4 states 0.421 -> 0.302 ms against one pass per state).

Removed variants (measured in a small-model step, 8 x 4096): the sublayer's input RMSNorm inside these kernels
(session 11, H100: net -0.14 / +0.12 ms all-MLA / hybrid; session 32, the forward writing y beside h: net +0.2 ms,
H200; kept in session 35 as ``mix_norm_triton.py``, y instead of h and the norm's backward inside); a block's running
sum added inside the next mix's kernels, forward and backward (sessions 12 and 29: the 41 adds 1.40 -> 0.17 ms, the
mixes +1.11 ms, net -0.04 ms, H200; ``kimi_vl/README.md``); the backward's pass B loading its tiles again (rows offset
by a run-time zero, so that pass A's tiles need not stay live) and 12 elements a thread at 4 programs an SM
(109-163 registers instead of 218-255): the 24 backward mixes of a step 2.23 -> 3.28 and 2.91 ms (session 30); the
forward and the flush as software-pipelined grid-stride loops (session 31: forward 0.082 -> 0.094-0.113 ms at N =
5, flush 0.291 -> 0.286-0.431; the step's 24 forward mixes 1.445 -> 1.643 ms).

Two ways to reach the sources (``KVL_ATTNRES_ADDRESSING``):

- ``args`` (default for ``N <= MAX_ARGS``): each source is its own pointer argument (``MAX_ARGS`` slots, unused
  ones repeat ``sources[0]`` and are never read), so a launch copies nothing to the device and never
  synchronises; Triton's own 16-byte alignment specialisation of pointer arguments vectorises the loads. The
  kernels take ``N`` as a compile-time constant (one compiled kernel per dtype and ``N``).
- ``table`` (always used for ``N > MAX_ARGS``, e.g. full AttnRes): the addresses go to the device as an
  ``int64 [N]`` table through pinned memory (the first version of these kernels; kept for many sources and
  so that the benchmark can time it).

Fixed launch configurations (no autotuning): address-table forward ``BLOCK_T * BLOCK_D = TILE_ELEMS`` with
``NUM_WARPS`` warps, pointer-argument forward the ``FWD_*`` constants, backward the ``BWD_*`` constants
(``bench_attnres --bwd-sweep`` times alternatives of the ``FWD_*`` and ``BWD_*`` ones).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from kernels.attn_res.sinks import GradSink, sink_buffers
from kernels.backend import sm_count
from kernels.colsum import column_sum
from kernels.fast_launch import CompiledLaunch, aligned16

TILE_ELEMS = 4096  # the address-table forward and the two-phase kernels: BLOCK_T * BLOCK_D per program
NUM_WARPS = 8
FWD_NUM_WARPS = 4  # the pointer-argument forward: the backward's row layout (see _row_blocks) with these settings
FWD_MAX_CHUNKS = 4
FWD_THREAD_ELEMS = 24
# Source tiles loaded ahead of the one in use (pointer-argument kernels; 8 = all of them). H200, M = 32768, D = 768,
# bf16 (session 20 call8, `bench_attnres --bwd-sweep`), 1 / 2 / 8 ahead: forward 0.096 / 0.081 / 0.079 ms at N = 4,
# 0.142 / 0.117 / 0.113 at N = 6; backward 0.179 / 0.168 / 0.166 at N = 4, 0.243 / 0.244 / 0.240 at N = 6.
FWD_PREFETCH = 8
BWD_NUM_WARPS = 4
BWD_MAX_CHUNKS = 4  # backward: a row is at most this many column chunks (unrolled)
BWD_THREAD_ELEMS = 24  # backward: elements of one source tile per thread (sets BLOCK_T)
BWD_PREFETCH = 8  # backward: the same, in both passes
FLUSH_NUM_WARPS = 4  # flush_deferred's kernel: the row layout with these settings
FLUSH_MAX_CHUNKS = 4
FLUSH_THREAD_ELEMS = 12  # 24 before session 22; with FLUSH_GROUP = 4 that spilled at 255 registers (ptxas, sm_90a)
# flush: shared sources per pass over the mixes, each dh tile loaded once a pass (1: the flush before session 22, which
# loaded every dh tile once per source; a window of dh tiles ahead there, FLUSH_PREFETCH 1 / 2 / 8, timed 0.123 / 0.115
# / 0.114 ms against 0.108 at N = 3 and 0.212 / 0.214 / 0.213 against 0.222 at N = 5 on an H200, session 22, removed).
# `ptxas_regs.py --attnres`: 186-233 registers at 12 elements a thread, no spills up to 7 sources
FLUSH_GROUP = 4
# backward grid: at most this many programs per SM, each strides over token tiles. H200, M = 32768, D = 768 (session 23
# call2, kernel + query-gradient sum): 2 / 4 / 8 / 16 a SM 0.124 / 0.134 / 0.143 / 0.161 ms at N = 3, 0.190 / 0.206 /
# 0.209 / 0.247 at N = 5 (from N = 3 the kernel takes 239-255 registers: 2 programs of 4 warps fit an SM); session 24
# call2, timed round-robin: 2 still best at N = 3 and 5, within 5% of 3 a SM at N = 2
BWD_PROGRAMS_PER_SM = 2
# backward: software-pipelining stages of the loop over token tiles (tl.range num_stages: the next tile's loads go to
# shared memory by cp.async while this one is computed; 1: none). H200, M = 32768, D = 768, bf16 (session 31 call1,
# `bench_attnres --bwd-sweep`): 1 / 2 / 3 stages 0.110 / 0.107 / 0.114 ms at N = 3, 0.183 / 0.165 / 0.261 at N = 5.
BWD_STAGES = 2
BWD_STAGE_BYTES = 96 * 1024  # staged tiles' shared memory a program at most, else one stage (two programs an SM fit)
BWD_MAXNREG: int | None = None  # backward: ptxas register cap (None: ptxas decides; ignored by the interpreter)
MAX_D = 16384
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_ARGS = 8
ADDRESSING = ("args", "table")


@triton.jit
def _token_tile(pid, M, D, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program ``pid``'s tile of ``BLOCK_T`` tokens x ``BLOCK_D`` features of an ``[M, D]`` row-major tensor:
    ``(offs_t, offs_d, t_ok, d_ok, tile_ok, offs)``, ``offs`` the tile's int64 element offsets."""
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    t_ok = offs_t < M
    d_ok = offs_d < D
    tile_ok = t_ok[:, None] & d_ok[None, :]
    return offs_t, offs_d, t_ok, d_ok, tile_ok, offs_t.to(tl.int64)[:, None] * D + offs_d[None, :]


@triton.jit
def _online_softmax_step(m, l, acc, s, x):
    """One source of an online softmax over sources: running max ``m``, sum ``l`` ``[T]`` and weighted sum
    ``acc [T, BLOCK_D]`` (fp32) updated with the source ``x`` of score ``s``."""
    m_new = tl.maximum(m, s)
    scale = tl.exp(m - m_new)
    p = tl.exp(s - m_new)
    return m_new, l * scale + p, acc * scale[:, None] + p[:, None] * x


@triton.jit
def _attn_res_fwd_kernel(
    src_tab, u_ptr, h_ptr, rstd_ptr, alpha_ptr, N, M, D, eps,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, ALIGNED: tl.constexpr,
):
    """Address-table forward (any ``N``, runtime loop over the sources): the scores go to ``alpha_ptr`` as they come
    and are turned into ``alpha = exp(s - m) / l`` there once the softmax's max and sum are known (after a barrier:
    a token's score may have been stored by another thread holding a copy of it)."""
    offs_t, offs_d, t_ok, d_ok, tile_ok, offs = _token_tile(tl.program_id(0), M, D, BLOCK_T, BLOCK_D)
    u = tl.load(u_ptr + offs_d, mask=d_ok, other=0.0)
    m = tl.full([BLOCK_T], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for n in range(N):
        src = tl.load(src_tab + n).to(h_ptr.dtype)
        if ALIGNED:
            src = tl.multiple_of(src, 16)
        x = tl.load(src + offs, mask=tile_ok, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        s = tl.sum(x * u[None, :], axis=1) * rstd
        tl.store(rstd_ptr + n * M + offs_t, rstd, mask=t_ok)
        tl.store(alpha_ptr + n * M + offs_t, s, mask=t_ok)
        m, l, acc = _online_softmax_step(m, l, acc, s, x)
    inv_l = 1.0 / l
    tl.store(h_ptr + offs, (acc * inv_l[:, None]).to(h_ptr.dtype.element_ty), mask=tile_ok)
    tl.debug_barrier()  # the scores' stores are visible to every thread of the program
    for n in range(N):
        s = tl.load(alpha_ptr + n * M + offs_t, mask=t_ok, other=0.0)
        tl.store(alpha_ptr + n * M + offs_t, tl.exp(s - m) * inv_l, mask=t_ok)


@triton.jit
def _load_row(base, rows, t_ok, D, CH: tl.constexpr, CHUNK: tl.constexpr):
    """A tile ``[BLOCK_T, CH * CHUNK]`` as a tuple of ``CH`` column chunks ``[BLOCK_T, CHUNK]`` (``rows``: ``[BLOCK_T,
    1]`` int64 row offsets), in the memory dtype."""
    out = ()
    for c in tl.static_range(CH):
        cols = c * CHUNK + tl.arange(0, CHUNK)
        out = out + (tl.load(base + rows + cols[None, :], mask=t_ok[:, None] & (cols < D)[None, :], other=0.0),)
    return out


@triton.jit
def _load_vec(base, D, CH: tl.constexpr, CHUNK: tl.constexpr):
    out = ()
    for c in tl.static_range(CH):
        cols = c * CHUNK + tl.arange(0, CHUNK)
        out = out + (tl.load(base + cols, mask=cols < D, other=0.0),)
    return out


@triton.jit
def _dots(dh, x, u, CH: tl.constexpr):
    """Per token ``(dh . x, u . x)``: products summed over the chunks in registers, then one reduction each."""
    xf = x[0].to(tl.float32)
    pg = dh[0] * xf
    pq = xf * u[0][None, :]
    for c in tl.static_range(1, CH):
        xf = x[c].to(tl.float32)
        pg += dh[c] * xf
        pq += xf * u[c][None, :]
    return tl.sum(pg, axis=1), tl.sum(pq, axis=1)


@triton.jit
def _write_grad(x, dh, u, du, dsrc, rows, t_ok, acc_on, a, r, g, q, big_g, D,
                CH: tl.constexpr, CHUNK: tl.constexpr):
    """``dx`` of one source, stored (added to the buffer's content where ``acc_on``), and ``du`` updated.

    ``a`` alpha, ``r`` rstd, ``g = dh . x``, ``q = u . x`` (score ``s = q r``), ``big_g = sum_j alpha_j g_j``:
    ``ds = a (g - big_g)``, ``dx = a dh + ds r (u - x r s / D) = a dh + k u - (k r s / D) x`` with ``k = ds r``,
    and ``du += ds key = k x``."""
    k = a * (g - big_g) * r
    e = k * q * r * r / D
    du_new = ()
    for c in tl.static_range(CH):
        cols = c * CHUNK + tl.arange(0, CHUNK)
        ok = t_ok[:, None] & (cols < D)[None, :]
        xf = x[c].to(tl.float32)
        dx = a[:, None] * dh[c] + k[:, None] * u[c][None, :] - e[:, None] * xf
        dx += tl.load(dsrc + rows + cols[None, :], mask=tl.where(acc_on, ok, False), other=0.0).to(tl.float32)
        tl.store(dsrc + rows + cols[None, :], dx.to(dsrc.dtype.element_ty), mask=ok)
        du_new = du_new + (du[c] + k[:, None] * xf,)
    return du_new


@triton.jit
def _defer_grad(x, du, coef, offs_t, t_ok, a, r, g, q, big_g, M, D, CH: tl.constexpr):
    """A deferred source (see :func:`flush_deferred`): its per-token coefficients ``(alpha, k, e)`` of ``dx = alpha dh
    + k u - e x`` go to ``coef [3, M]`` instead of ``dx`` to memory; ``du`` is updated as in :func:`_write_grad`."""
    k = a * (g - big_g) * r
    tl.store(coef + offs_t, a, mask=t_ok)
    tl.store(coef + M + offs_t, k, mask=t_ok)
    tl.store(coef + 2 * M + offs_t, k * q * r * r / D, mask=t_ok)
    du_new = ()
    for c in tl.static_range(CH):
        du_new = du_new + (du[c] + k[:, None] * x[c].to(tl.float32),)
    return du_new


@triton.jit
def _store_du(du_ptr, du, D, CH: tl.constexpr, CHUNK: tl.constexpr):
    for c in tl.static_range(CH):
        cols = c * CHUNK + tl.arange(0, CHUNK)
        tl.store(du_ptr + cols, tl.sum(du[c], axis=0), mask=cols < D)


@triton.jit
def _zeros_row(BLOCK_T: tl.constexpr, CH: tl.constexpr, CHUNK: tl.constexpr):
    out = ()
    for _c in tl.static_range(CH):
        out = out + (tl.zeros([BLOCK_T, CHUNK], dtype=tl.float32),)
    return out


@triton.jit
def _to_f32(t, CH: tl.constexpr):
    out = ()
    for c in tl.static_range(CH):
        out = out + (t[c].to(tl.float32),)
    return out


@triton.jit
def _attn_res_bwd_kernel(
    src_tab, dsrc_tab, u_ptr, dh_ptr, rstd_ptr, alpha_ptr, gq_ptr, du_ptr, N, M, D, num_tiles,
    BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, CH: tl.constexpr, ALIGNED: tl.constexpr,
):
    """Address-table backward (any ``N``, runtime loop over the sources): pass A keeps ``g_n, q_n`` per token in
    ``gq [2, N, M]`` (read back by the same program after a barrier), pass B writes ``dx_n``."""
    pid = tl.program_id(0)
    u = _load_vec(u_ptr, D, CH, CHUNK)
    du = _zeros_row(BLOCK_T, CH, CHUNK)
    for tile in range(pid, num_tiles, tl.num_programs(0)):
        offs_t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = offs_t < M
        rows = offs_t.to(tl.int64)[:, None] * D
        dh = _to_f32(_load_row(dh_ptr, rows, t_ok, D, CH, CHUNK), CH)
        big_g = tl.zeros([BLOCK_T], dtype=tl.float32)
        for n in range(N):
            src = tl.load(src_tab + n).to(dh_ptr.dtype)
            if ALIGNED:
                src = tl.multiple_of(src, 16)
            g, q = _dots(dh, _load_row(src, rows, t_ok, D, CH, CHUNK), u, CH)
            big_g += tl.load(alpha_ptr + n * M + offs_t, mask=t_ok, other=0.0) * g
            tl.store(gq_ptr + n * M + offs_t, g, mask=t_ok)
            tl.store(gq_ptr + (N + n) * M + offs_t, q, mask=t_ok)
        tl.debug_barrier()  # pass A's g, q stores are visible to every thread of the program
        for n in range(N):
            src = tl.load(src_tab + n).to(dh_ptr.dtype)
            dsrc = tl.load(dsrc_tab + n).to(dh_ptr.dtype)
            if ALIGNED:
                src = tl.multiple_of(src, 16)
                dsrc = tl.multiple_of(dsrc, 16)
            du = _write_grad(
                _load_row(src, rows, t_ok, D, CH, CHUNK), dh, u, du, dsrc, rows, t_ok, False,
                tl.load(alpha_ptr + n * M + offs_t, mask=t_ok, other=0.0),
                tl.load(rstd_ptr + n * M + offs_t, mask=t_ok, other=0.0),
                tl.load(gq_ptr + n * M + offs_t, mask=t_ok, other=0.0),
                tl.load(gq_ptr + (N + n) * M + offs_t, mask=t_ok, other=0.0), big_g, D, CH, CHUNK)
    _store_du(du_ptr + pid * D, du, D, CH, CHUNK)


@triton.jit
def _pick(n: tl.constexpr, p0, p1, p2, p3, p4, p5, p6, p7):
    """The ``n``-th of eight pointer arguments (``n`` a compile-time constant: no runtime select)."""
    if n == 0:
        p = p0
    elif n == 1:
        p = p1
    elif n == 2:
        p = p2
    elif n == 3:
        p = p3
    elif n == 4:
        p = p4
    elif n == 5:
        p = p5
    elif n == 6:
        p = p6
    else:
        p = p7
    return p


@triton.jit
def _prefetch(win, n: tl.constexpr, N: tl.constexpr, x0, x1, x2, x3, x4, x5, x6, x7, rows, t_ok, D,
              CH: tl.constexpr, CHUNK: tl.constexpr):
    """``win`` (a tuple of source tiles) with source ``n``'s tile appended when ``n < N``: the kernels index
    ``win[n]`` and keep ``PRE`` tiles loaded ahead of the one in use."""
    if n < N:
        win = win + (_load_row(_pick(n, x0, x1, x2, x3, x4, x5, x6, x7), rows, t_ok, D, CH, CHUNK),)
    return win


@triton.jit
def _fwd_stats(x, u, D, eps, CH: tl.constexpr):
    """Per token of a source tile (a tuple of ``CH`` chunks): fp32 chunks, ``rstd`` and score ``s = (u . x) rstd``;
    products summed over the chunks in registers, then one reduction each."""
    xs = _to_f32(x, CH)
    pss = xs[0] * xs[0]
    pq = xs[0] * u[0][None, :]
    for c in tl.static_range(1, CH):
        pss += xs[c] * xs[c]
        pq += xs[c] * u[c][None, :]
    rstd = 1.0 / tl.sqrt(tl.sum(pss, axis=1) / D + eps)
    return xs, rstd, tl.sum(pq, axis=1) * rstd


@triton.jit
def _attn_res_fwd_rows_kernel(
    x0, x1, x2, x3, x4, x5, x6, x7, u_ptr, h_ptr, rstd_ptr, alpha_ptr, N: tl.constexpr, M, D, eps,
    BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, CH: tl.constexpr, PRE: tl.constexpr = 1,
):
    """Pointer-argument forward, ``N`` a compile-time constant, the backward's layout: a row is ``CH`` chunks of
    ``CHUNK`` columns owned by one warp (the per-token sums are warp shuffles; ``D = 768`` is 3 x 256, no padding),
    straight-line code over the sources with the next ``PRE`` sources' tiles loaded before the current one is used.
    The scores stay in registers and ``alpha = exp(s - m) / l`` is stored once the softmax's normaliser is known."""
    offs_t, t_ok, rows, acc, inv_l, m, scores = _rows_mix(x0, x1, x2, x3, x4, x5, x6, x7, u_ptr, rstd_ptr, N, M, D,
                                                          eps, BLOCK_T, CHUNK, CH, PRE)
    for c in tl.static_range(CH):
        cols = c * CHUNK + tl.arange(0, CHUNK)
        tl.store(h_ptr + rows + cols[None, :], (acc[c] * inv_l[:, None]).to(h_ptr.dtype.element_ty),
                 mask=t_ok[:, None] & (cols < D)[None, :])
    _store_alpha(alpha_ptr, scores, m, inv_l, offs_t, t_ok, N, M)


@triton.jit
def _rows_mix(x0, x1, x2, x3, x4, x5, x6, x7, u_ptr, rstd_ptr, N: tl.constexpr, M, D, eps,
              BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, CH: tl.constexpr, PRE: tl.constexpr):
    """The program's tile of the pointer-argument forward up to ``h``: stores ``rstd``, returns ``(offs_t, t_ok, rows,
    acc, inv_l, m, scores)`` with ``h = acc * inv_l`` (``CH`` fp32 chunks), for :func:`_store_alpha` after the caller's
    output. Also ``mix_norm_triton``'s."""
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = offs_t < M
    rows = offs_t.to(tl.int64)[:, None] * D
    u = _load_vec(u_ptr, D, CH, CHUNK)
    win = ()
    for j in tl.static_range(PRE):
        win = _prefetch(win, j, N, x0, x1, x2, x3, x4, x5, x6, x7, rows, t_ok, D, CH, CHUNK)
    m = tl.full([BLOCK_T], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc = _zeros_row(BLOCK_T, CH, CHUNK)
    scores = ()
    for n in tl.static_range(N):
        x = win[n]
        win = _prefetch(win, n + PRE, N, x0, x1, x2, x3, x4, x5, x6, x7, rows, t_ok, D, CH, CHUNK)
        xs, rstd, s = _fwd_stats(x, u, D, eps, CH)
        tl.store(rstd_ptr + n * M + offs_t, rstd, mask=t_ok)
        scores = scores + (s,)
        m_new = tl.maximum(m, s)
        scale = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        acc_new = ()
        for c in tl.static_range(CH):
            acc_new = acc_new + (acc[c] * scale[:, None] + p[:, None] * xs[c],)
        acc = acc_new
        l = l * scale + p
        m = m_new
    return offs_t, t_ok, rows, acc, 1.0 / l, m, scores


@triton.jit
def _store_alpha(alpha_ptr, scores, m, inv_l, offs_t, t_ok, N: tl.constexpr, M):
    for n in tl.static_range(N):  # exp(s - m) / l: no log (see the module docstring)
        tl.store(alpha_ptr + n * M + offs_t, tl.exp(scores[n] - m) * inv_l, mask=t_ok)


@triton.jit(do_not_specialize=["acc_mask"])
def _attn_res_bwd_args_kernel(
    x0, x1, x2, x3, x4, x5, x6, x7, g0, g1, g2, g3, g4, g5, g6, g7,
    u_ptr, dh_ptr, rstd_ptr, alpha_ptr, du_ptr, N: tl.constexpr, M, D, num_tiles, acc_mask, coef_ptr,
    BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, CH: tl.constexpr, DEFER: tl.constexpr, PRE: tl.constexpr = 1,
    STAGES: tl.constexpr = 1,
):
    """Pointer-argument backward, ``N`` a compile-time constant: straight-line code over the sources, the next
    ``PRE`` sources' tiles loaded before the current one is used (both passes); per token ``g_n``, ``q_n``, alpha and rstd
    stay in registers between the passes. Bit ``n`` of ``acc_mask``: add ``dx_n`` to the buffer's content. Bit ``n``
    of ``DEFER`` (compile time): source ``n``'s gradient is deferred, its coefficients go to ``coef [N, 3, M]``."""
    pid = tl.program_id(0)
    u = _load_vec(u_ptr, D, CH, CHUNK)
    du = _zeros_row(BLOCK_T, CH, CHUNK)
    for tile in tl.range(pid, num_tiles, tl.num_programs(0), num_stages=STAGES):
        offs_t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = offs_t < M
        rows = offs_t.to(tl.int64)[:, None] * D
        win = ()
        for j in tl.static_range(PRE):
            win = _prefetch(win, j, N, x0, x1, x2, x3, x4, x5, x6, x7, rows, t_ok, D, CH, CHUNK)
        dh = _to_f32(_load_row(dh_ptr, rows, t_ok, D, CH, CHUNK), CH)
        big_g = tl.zeros([BLOCK_T], dtype=tl.float32)
        gs, qs, alphas, rstds = (), (), (), ()
        for n in tl.static_range(N):  # pass A: per-token dot products
            x = win[n]
            win = _prefetch(win, n + PRE, N, x0, x1, x2, x3, x4, x5, x6, x7, rows, t_ok, D, CH, CHUNK)
            a = tl.load(alpha_ptr + n * M + offs_t, mask=t_ok, other=0.0)
            g, q = _dots(dh, x, u, CH)
            big_g += a * g
            gs, qs = gs + (g,), qs + (q,)
            alphas = alphas + (a,)
            rstds = rstds + (tl.load(rstd_ptr + n * M + offs_t, mask=t_ok, other=0.0),)
        win = ()  # the same loads as pass A's: the compiler merges them (no second read)
        for j in tl.static_range(PRE):
            win = _prefetch(win, j, N, x0, x1, x2, x3, x4, x5, x6, x7, rows, t_ok, D, CH, CHUNK)
        for n in tl.static_range(N):  # pass B: gradients, no reductions
            x = win[n]
            win = _prefetch(win, n + PRE, N, x0, x1, x2, x3, x4, x5, x6, x7, rows, t_ok, D, CH, CHUNK)
            if (DEFER >> n) & 1:
                du = _defer_grad(x, du, coef_ptr + n * 3 * M, offs_t, t_ok, alphas[n], rstds[n], gs[n], qs[n],
                                 big_g, M, D, CH)
            else:
                du = _write_grad(x, dh, u, du, _pick(n, g0, g1, g2, g3, g4, g5, g6, g7), rows, t_ok,
                                 ((acc_mask >> n) & 1) != 0, alphas[n], rstds[n], gs[n], qs[n], big_g, D, CH, CHUNK)
    _store_du(du_ptr + pid * D, du, D, CH, CHUNK)


@triton.jit(do_not_specialize=["acc_mask"])
def _attn_res_flush_kernel(
    x0, x1, x2, x3, x4, x5, x6, x7, g0, g1, g2, g3, g4, g5, g6, g7,
    d0, d1, d2, d3, d4, d5, d6, d7, c0, c1, c2, c3, c4, c5, c6, c7, u0, u1, u2, u3, u4, u5, u6, u7,
    M, D, acc_mask, C: tl.constexpr, S: tl.constexpr,
    BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, CH: tl.constexpr, GROUP: tl.constexpr = 1,
):
    """The deferred gradients of ``C`` shared sources ``x_n`` (into buffers ``g_n``; bit ``n`` of ``acc_mask``: add
    to the content) from ``S`` mixes (gradient of the output ``d_i``, coefficients ``c_i [C', 3, M]``, query
    ``u_i``): ``dx_n = sum_i (alpha_ni d_i + k_ni u_i) - (sum_i e_ni) x_n``, summed in fp32, rounded once.
    ``GROUP`` sources per pass over the mixes: each ``d_i`` tile is loaded once a pass and feeds ``GROUP`` fp32
    accumulators (1: once per source). A program per token tile: a grid-stride loop over tiles compiled to 255
    registers with spills from N = 3 (186-233 without, ptxas sm_90a) and took 0.26 / 0.44 ms against 0.19 / 0.30 at
    N = 3 / 5 (2, 4 or 8 programs an SM; H200, session 23 call4); removed."""
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = offs_t < M
    rows = offs_t.to(tl.int64)[:, None] * D
    for n0 in tl.static_range(0, C, GROUP):
        acc = ()  # the group's sources' CH chunks, source-major
        e_sum = ()
        for j in tl.static_range(GROUP):
            if n0 + j < C:
                acc = acc + _zeros_row(BLOCK_T, CH, CHUNK)
                e_sum = e_sum + (tl.zeros([BLOCK_T], dtype=tl.float32),)
        for i in tl.static_range(S):
            dh = _to_f32(_load_row(_pick(i, d0, d1, d2, d3, d4, d5, d6, d7), rows, t_ok, D, CH, CHUNK), CH)
            u = _load_vec(_pick(i, u0, u1, u2, u3, u4, u5, u6, u7), D, CH, CHUNK)
            acc_new = ()
            e_new = ()
            for j in tl.static_range(GROUP):
                if n0 + j < C:
                    coef = _pick(i, c0, c1, c2, c3, c4, c5, c6, c7) + (n0 + j) * 3 * M
                    a = tl.load(coef + offs_t, mask=t_ok, other=0.0)
                    k = tl.load(coef + M + offs_t, mask=t_ok, other=0.0)
                    e_new = e_new + (e_sum[j] + tl.load(coef + 2 * M + offs_t, mask=t_ok, other=0.0),)
                    for c in tl.static_range(CH):
                        acc_new = acc_new + (acc[j * CH + c] + a[:, None] * dh[c] + k[:, None] * u[c][None, :],)
            acc = acc_new
            e_sum = e_new
        for j in tl.static_range(GROUP):
            if n0 + j < C:
                x = _load_row(_pick(n0 + j, x0, x1, x2, x3, x4, x5, x6, x7), rows, t_ok, D, CH, CHUNK)
                dsrc = _pick(n0 + j, g0, g1, g2, g3, g4, g5, g6, g7)
                acc_on = ((acc_mask >> (n0 + j)) & 1) != 0
                for c in tl.static_range(CH):
                    cols = c * CHUNK + tl.arange(0, CHUNK)
                    ok = t_ok[:, None] & (cols < D)[None, :]
                    dx = acc[j * CH + c] - e_sum[j][:, None] * x[c].to(tl.float32)
                    dx += tl.load(dsrc + rows + cols[None, :], mask=tl.where(acc_on, ok, False),
                                  other=0.0).to(tl.float32)
                    tl.store(dsrc + rows + cols[None, :], dx.to(dsrc.dtype.element_ty), mask=ok)


# compiled kernels called directly after a specialisation's first launch (kernels.fast_launch; ~5 ms of host time a
# step less for the small hybrid's 76 launches, session 29)
_FWD_ROWS = CompiledLaunch(_attn_res_fwd_rows_kernel)
_BWD_ARGS = CompiledLaunch(_attn_res_bwd_args_kernel)
_FLUSH = CompiledLaunch(_attn_res_flush_kernel)


@functools.lru_cache(maxsize=64)
def _blocks(d: int) -> tuple[int, int]:
    block_d = triton.next_power_of_2(d)
    return max(1, TILE_ELEMS // block_d), block_d


@functools.lru_cache(maxsize=64)
def _row_blocks(d: int, elem_bytes: int, num_warps: int, max_chunks: int, thread_elems: int) -> tuple[int, int, int]:
    """``(BLOCK_T, CHUNK, CH)`` of the row layout (the backward and the pointer-argument forward): a row is ``CH``
    chunks of ``CHUNK`` columns, ``CHUNK`` at least one warp's width of 16-byte vectors (so that a warp owns whole
    rows: the per-token dot products are warp shuffles, and ``D = 768`` is 3 x 256 with no padding), ``CH <=
    max_chunks``; ``BLOCK_T`` rows (a power of two) give each thread about ``thread_elems`` elements of a tile."""
    chunk = max(32 * 16 // elem_bytes, triton.next_power_of_2(triton.cdiv(d, max_chunks)))
    ch = triton.cdiv(d, chunk)
    rows = max(1, thread_elems * 32 * num_warps // (ch * chunk))
    return 1 << (rows.bit_length() - 1), chunk, ch


def _address_table(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """``int64 [N]`` addresses on ``device``. On CUDA the copy goes through pinned memory and is asynchronous:
    a pageable copy would synchronise the stream at every mix and stall the host's run-ahead."""
    ptrs = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    return ptrs.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else ptrs


def addressing() -> str:
    """``KVL_ATTNRES_ADDRESSING`` (``args`` | ``table``), ``args`` when unset."""
    mode = os.environ.get("KVL_ATTNRES_ADDRESSING") or "args"
    if mode not in ADDRESSING:
        raise ValueError(f"kernels/attn_res/mix_triton.py: KVL_ATTNRES_ADDRESSING must be one of {ADDRESSING}, "
                         f"got {mode!r}")
    return mode


def use_args(n: int) -> bool:
    """Whether a mix over ``n`` sources passes them as pointer arguments (else through an address table)."""
    return n <= MAX_ARGS and addressing() == "args"


def _slots(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``MAX_ARGS`` pointer arguments: the tensors, then ``tensors[0]`` repeated (never read: ``n < N`` skips)."""
    return list(tensors) + [tensors[0]] * (MAX_ARGS - len(tensors))


def _aligned(tensors: list[torch.Tensor]) -> bool:
    """Every address 16-byte aligned: lets the compiler vectorise loads through the address table."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def _num_bwd_programs(num_tiles: int, device: torch.device) -> int:
    if device.type != "cuda":
        return min(num_tiles, 4)
    return min(num_tiles, BWD_PROGRAMS_PER_SM * sm_count(device))


def bwd_stages(n: int, block_t: int, chunk: int, ch: int, elem_bytes: int) -> int:
    """The backward's pipelining stages for ``n`` sources: ``BWD_STAGES`` when their staged tiles (the sources and
    ``dh``, each ``block_t x ch * chunk``) fit in ``BWD_STAGE_BYTES`` of shared memory, else 1."""
    staged = BWD_STAGES * (n + 1) * block_t * ch * chunk * elem_bytes
    return BWD_STAGES if staged <= BWD_STAGE_BYTES else 1


def _maxnreg() -> dict[str, int]:
    return {} if BWD_MAXNREG is None else {"maxnreg": BWD_MAXNREG}


def mix_fwd_triton(sources: list[torch.Tensor], u: torch.Tensor, eps: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sources``: N contiguous ``[M, D]`` of one dtype; ``u = w * gain`` fp32 ``[D]``.

    Returns ``h [M, D]`` (source dtype), fp32 ``rstd [N, M]`` and ``alpha [N, M]``."""
    x0 = sources[0]
    n, (m, d) = len(sources), x0.shape
    h = torch.empty_like(x0)
    rstd = torch.empty(n, m, device=x0.device, dtype=torch.float32)
    alpha = torch.empty(n, m, device=x0.device, dtype=torch.float32)
    if use_args(n):
        block_t, chunk, ch = _row_blocks(d, x0.element_size(), FWD_NUM_WARPS, FWD_MAX_CHUNKS, FWD_THREAD_ELEMS)
        key = (x0.dtype, aligned16(*sources, u), n, m, d, block_t, chunk, ch, FWD_PREFETCH, FWD_NUM_WARPS)
        _FWD_ROWS((triton.cdiv(m, block_t),), key, *_slots(sources), u, h, rstd, alpha, n, m, d, float(eps),
                  block_t, chunk, ch, FWD_PREFETCH, num_warps=FWD_NUM_WARPS)  # eps always fp32 (not in the key)
    else:  # any number of sources
        block_t, block_d = _blocks(d)
        _attn_res_fwd_kernel[(triton.cdiv(m, block_t),)](
            _address_table(sources, x0.device), u, h, rstd, alpha, n, m, d, eps,
            BLOCK_T=block_t, BLOCK_D=block_d, ALIGNED=_aligned(sources), num_warps=NUM_WARPS)
    return h, rstd, alpha


def mix_bwd_triton(sources: list[torch.Tensor], u: torch.Tensor, dh: torch.Tensor, rstd: torch.Tensor,
                   alpha: torch.Tensor, sinks: list[GradSink | None] | None = None, defer: int = 0
                   ) -> tuple[list[torch.Tensor | None], torch.Tensor, torch.Tensor | None]:
    """Gradients ``dx_n [M, D]`` (source dtype), ``du [D]`` fp32 and the deferred sources' coefficients; ``dh
    [M, D]`` in the source dtype.

    With ``sinks`` (pointer-argument path only), source ``n`` with a sink gets its gradient added into the
    sink's buffer in the kernel (the buffer is started by the first mix to run backward), and ``dx_n`` is
    that buffer. Bit ``n`` of ``defer`` (pointer-argument path only): source ``n``'s gradient is not formed here;
    ``dx_n`` is ``None`` and fp32 ``coef [N, 3, M]`` holds its per-token coefficients for :func:`flush_triton`
    (third result; ``None`` without ``defer``)."""
    x0 = sources[0]
    n, (m, d) = len(sources), x0.shape
    if defer and not use_args(n):
        raise ValueError(f"kernels/attn_res/mix_triton.py: deferred gradients need the pointer-argument path "
                         f"(N <= {MAX_ARGS}, KVL_ATTNRES_ADDRESSING=args), got N={n}")
    task = torch._C._current_graph_task_id() if sinks is not None else -1
    dxs, acc_mask = sink_buffers(list(sinks or [None] * n), x0, task, skip=defer)
    coef = torch.empty(n, 3, m, device=x0.device, dtype=torch.float32) if defer else None
    block_t, chunk, ch = _row_blocks(d, x0.element_size(), BWD_NUM_WARPS, BWD_MAX_CHUNKS, BWD_THREAD_ELEMS)
    num_tiles = triton.cdiv(m, block_t)
    programs = _num_bwd_programs(num_tiles, x0.device)
    du_partial = torch.empty(programs, d, device=x0.device, dtype=torch.float32)
    if use_args(n):  # dxs, rstd, alpha, du_partial and coef are new or sink buffers: allocations are aligned
        key = (x0.dtype, aligned16(*sources, u, dh), n, m, d, num_tiles, block_t, chunk, ch, defer, BWD_PREFETCH,
               BWD_NUM_WARPS, BWD_MAXNREG, BWD_STAGES, BWD_STAGE_BYTES)
        _BWD_ARGS((programs,), key, *_slots(sources), *_slots(dxs), u, dh, rstd, alpha, du_partial, n, m, d,
                  num_tiles, acc_mask, alpha if coef is None else coef, block_t, chunk, ch, defer, BWD_PREFETCH,
                  bwd_stages(n, block_t, chunk, ch, x0.element_size()), num_warps=BWD_NUM_WARPS, **_maxnreg())
    else:
        if acc_mask:
            raise ValueError(f"kernels/attn_res/mix_triton.py: gradient sinks need the pointer-argument path "
                             f"(N <= {MAX_ARGS}, KVL_ATTNRES_ADDRESSING=args), got N={n}")
        gq = torch.empty(2, n, m, device=x0.device, dtype=torch.float32)
        _attn_res_bwd_kernel[(programs,)](
            _address_table(sources, x0.device), _address_table(dxs, x0.device), u, dh, rstd, alpha, gq, du_partial,
            n, m, d, num_tiles, BLOCK_T=block_t, CHUNK=chunk, CH=ch, ALIGNED=_aligned(sources + dxs),
            num_warps=BWD_NUM_WARPS, **_maxnreg())
    return [None if (defer >> i) & 1 else dx for i, dx in enumerate(dxs)], column_sum(du_partial), coef


def flush_triton(sources: list[torch.Tensor], bufs: list[torch.Tensor], acc_mask: int, dhs: list[torch.Tensor],
                 us: list[torch.Tensor], coefs: list[torch.Tensor]) -> None:
    """The deferred gradients of ``C = len(sources)`` sources into ``bufs`` (bit ``n`` of ``acc_mask``: add to the
    content) from ``S = len(dhs)`` mixes' ``dh``, ``u`` and coefficients (``_attn_res_flush_kernel``)."""
    if len(dhs) > MAX_ARGS or len(sources) > MAX_ARGS:
        raise ValueError(f"kernels/attn_res/mix_triton.py: a deferred block holds at most {MAX_ARGS} mixes and "
                         f"{MAX_ARGS} sources, got {len(dhs)} and {len(sources)}")
    x0 = sources[0]
    m, d = x0.shape
    block_t, chunk, ch = _row_blocks(d, x0.element_size(), FLUSH_NUM_WARPS, FLUSH_MAX_CHUNKS, FLUSH_THREAD_ELEMS)
    c, s = len(sources), len(dhs)
    key = (x0.dtype, aligned16(*sources, *bufs, *dhs, *coefs, *us), m, d, c, s, block_t, chunk, ch, FLUSH_GROUP,
           FLUSH_NUM_WARPS)
    _FLUSH((triton.cdiv(m, block_t),), key, *_slots(sources), *_slots(bufs), *_slots(dhs), *_slots(coefs),
           *_slots(us), m, d, acc_mask, c, s, block_t, chunk, ch, FLUSH_GROUP, num_warps=FLUSH_NUM_WARPS)
