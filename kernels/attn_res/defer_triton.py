"""Deferred block-state gradients with the score products formed in the flush (``mix_triton.FLUSH_DOTS``).

A block's mixes read the same ``C`` completed block states ``x_n`` and, after the block's first sublayer, the
block's running sum ``p``. Per token and mix the backward needs ``g_n = dh . x_n`` for every source, but only
through ``ds_n = alpha_n (g_n - G)`` with ``G = sum_j alpha_j g_j = dh . h`` (``h`` the mix's output, which its
sublayer norm keeps anyway). So a mix's own backward (:func:`bwd_light`) reads ``dh``, ``h`` and ``p`` alone:
it forms ``c = dh . h`` per token, the running sum's gradient (with the later running sum's gradient added in the
same pass, so the stream needs no gradient add per sublayer) and the query gradient's share from ``p``. The states'
gradients wait for the block's flush (:func:`flush_dots`), which reads each state once and every mix's ``dh`` once
per group of states, forms ``g_n`` and ``q_n = u . x_n`` there, and writes each state's

    dx_n += sum_i alpha_in dh_i + k_in u_i - e_in x_n,   k = alpha (g - c) rstd,  e = k q rstd^2 / D

plus the per-token ``k_in`` (``K [S, C, M]``, the states' dtype): the queries' gradients from the states,
``du_i += sum_t k_int x_nt``, are ``C`` small matrix products ``K[:, n] @ x_n`` after the flush.

Against the first deferral (``mix_triton``'s ``DEFER`` bits) a mix's backward no longer reads the ``C`` states
(they are read once per block in the flush instead of once per mix), reads ``h`` instead, and takes over the running
sum's gradient add; the flush gains the products and ``K``, and the states are read once more for ``du``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attn_res.mix_triton import (
    BWD_NUM_WARPS,
    FLUSH_NUM_WARPS,
    _dots,
    _load_row,
    _load_vec,
    _num_bwd_programs,
    _pick,
    _row_blocks,
    _slots,
    _store_du,
    _to_f32,
    _zeros_row,
)
from kernels.colsum import column_sum
from kernels.fast_launch import CompiledLaunch, aligned16

LIGHT_THREAD_ELEMS = 24  # bwd_light: elements of one tile per thread (sets BLOCK_T), as the mix backward's
LIGHT_MAX_CHUNKS = 4
LIGHT_STAGES = 2  # bwd_light's software-pipelining stages over token tiles (as the mix backward's BWD_STAGES)
FLUSH_DOTS_GROUP = 2  # flush_dots: states per pass over the mixes (their tiles stay in registers for the products)
FLUSH_DOTS_THREAD_ELEMS = 12


@triton.jit
def _attn_res_bwd_light_kernel(
    x_ptr, h_ptr, dh_ptr, gn_ptr, dx_ptr, u_ptr, alpha_ptr, rstd_ptr, c_ptr, du_ptr, M, D, num_tiles,
    BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, CH: tl.constexpr, HAS_X: tl.constexpr, HAS_NEXT: tl.constexpr,
    STAGES: tl.constexpr = 1,
):
    """Per token ``c = dh . h`` (to ``c_ptr``); with ``HAS_X`` the running sum ``x``'s gradient ``a dh + k u - e x``
    (plus the later running sum's gradient ``gn`` with ``HAS_NEXT``) to ``dx_ptr`` and ``du``'s per-program sum of
    ``k x`` to ``du_ptr``. ``alpha_ptr`` / ``rstd_ptr``: the running sum's row of the mix's saved statistics."""
    pid = tl.program_id(0)
    if HAS_X:
        u = _load_vec(u_ptr, D, CH, CHUNK)
    du = _zeros_row(BLOCK_T, CH, CHUNK)
    for tile in tl.range(pid, num_tiles, tl.num_programs(0), num_stages=STAGES):
        offs_t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = offs_t < M
        rows = offs_t.to(tl.int64)[:, None] * D
        dh = _to_f32(_load_row(dh_ptr, rows, t_ok, D, CH, CHUNK), CH)
        h = _load_row(h_ptr, rows, t_ok, D, CH, CHUNK)
        pc = dh[0] * h[0].to(tl.float32)
        for c in tl.static_range(1, CH):
            pc += dh[c] * h[c].to(tl.float32)
        big_g = tl.sum(pc, axis=1)
        tl.store(c_ptr + offs_t, big_g, mask=t_ok)
        if HAS_X:
            x = _load_row(x_ptr, rows, t_ok, D, CH, CHUNK)
            g, q = _dots(dh, x, u, CH)
            a = tl.load(alpha_ptr + offs_t, mask=t_ok, other=0.0)
            r = tl.load(rstd_ptr + offs_t, mask=t_ok, other=0.0)
            k = a * (g - big_g) * r
            e = k * q * r * r / D
            du_new = ()
            for c in tl.static_range(CH):
                cols = c * CHUNK + tl.arange(0, CHUNK)
                ok = t_ok[:, None] & (cols < D)[None, :]
                xf = x[c].to(tl.float32)
                dx = a[:, None] * dh[c] + k[:, None] * u[c][None, :] - e[:, None] * xf
                if HAS_NEXT:
                    dx += tl.load(gn_ptr + rows + cols[None, :], mask=ok, other=0.0).to(tl.float32)
                tl.store(dx_ptr + rows + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=ok)
                du_new = du_new + (du[c] + k[:, None] * xf,)
            du = du_new
    if HAS_X:
        _store_du(du_ptr + pid * D, du, D, CH, CHUNK)


@triton.jit(do_not_specialize=["acc_mask"])
def _attn_res_flush_dots_kernel(
    x0, x1, x2, x3, x4, x5, x6, x7, g0, g1, g2, g3, g4, g5, g6, g7,
    d0, d1, d2, d3, d4, d5, d6, d7, u0, u1, u2, u3, u4, u5, u6, u7,
    a0, a1, a2, a3, a4, a5, a6, a7, r0, r1, r2, r3, r4, r5, r6, r7,
    c0, c1, c2, c3, c4, c5, c6, c7, k_ptr,
    M, D, acc_mask, C: tl.constexpr, S: tl.constexpr,
    BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, CH: tl.constexpr, GROUP: tl.constexpr = 1,
):
    """The gradients of ``C`` block states ``x_n`` (into ``g_n``; bit ``n`` of ``acc_mask``: add to the content) from
    ``S`` mixes (``d_i = dh``, query ``u_i``, saved ``alpha_i [N_i, M]`` / ``rstd_i`` whose first ``C`` rows are the
    states', ``c_i = dh . h``), and ``k_in`` to ``k_ptr [S, C, M]``. ``GROUP`` states per pass over the mixes."""
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = offs_t < M
    rows = offs_t.to(tl.int64)[:, None] * D
    for n0 in tl.static_range(0, C, GROUP):
        xs = ()
        acc = ()  # the group's states' CH chunks, state-major
        e_sum = ()
        for j in tl.static_range(GROUP):
            if n0 + j < C:
                xs = xs + (_load_row(_pick(n0 + j, x0, x1, x2, x3, x4, x5, x6, x7), rows, t_ok, D, CH, CHUNK),)
                acc = acc + _zeros_row(BLOCK_T, CH, CHUNK)
                e_sum = e_sum + (tl.zeros([BLOCK_T], dtype=tl.float32),)
        for i in tl.static_range(S):
            dh = _to_f32(_load_row(_pick(i, d0, d1, d2, d3, d4, d5, d6, d7), rows, t_ok, D, CH, CHUNK), CH)
            u = _load_vec(_pick(i, u0, u1, u2, u3, u4, u5, u6, u7), D, CH, CHUNK)
            big_g = tl.load(_pick(i, c0, c1, c2, c3, c4, c5, c6, c7) + offs_t, mask=t_ok, other=0.0)
            acc_new = ()
            e_new = ()
            for j in tl.static_range(GROUP):
                if n0 + j < C:
                    n = n0 + j
                    g, q = _dots(dh, xs[j], u, CH)
                    a = tl.load(_pick(i, a0, a1, a2, a3, a4, a5, a6, a7) + n * M + offs_t, mask=t_ok, other=0.0)
                    r = tl.load(_pick(i, r0, r1, r2, r3, r4, r5, r6, r7) + n * M + offs_t, mask=t_ok, other=0.0)
                    k = a * (g - big_g) * r
                    tl.store(k_ptr + (i * C + n) * M + offs_t, k.to(k_ptr.dtype.element_ty), mask=t_ok)
                    e_new = e_new + (e_sum[j] + k * q * r * r / D,)
                    for c in tl.static_range(CH):
                        acc_new = acc_new + (acc[j * CH + c] + a[:, None] * dh[c] + k[:, None] * u[c][None, :],)
            acc = acc_new
            e_sum = e_new
        for j in tl.static_range(GROUP):
            if n0 + j < C:
                dsrc = _pick(n0 + j, g0, g1, g2, g3, g4, g5, g6, g7)
                acc_on = ((acc_mask >> (n0 + j)) & 1) != 0
                for c in tl.static_range(CH):
                    cols = c * CHUNK + tl.arange(0, CHUNK)
                    ok = t_ok[:, None] & (cols < D)[None, :]
                    dx = acc[j * CH + c] - e_sum[j][:, None] * xs[j][c].to(tl.float32)
                    dx += tl.load(dsrc + rows + cols[None, :], mask=tl.where(acc_on, ok, False),
                                  other=0.0).to(tl.float32)
                    tl.store(dsrc + rows + cols[None, :], dx.to(dsrc.dtype.element_ty), mask=ok)


_LIGHT = CompiledLaunch(_attn_res_bwd_light_kernel)
_FLUSH_DOTS = CompiledLaunch(_attn_res_flush_dots_kernel)


def bwd_light(x: torch.Tensor | None, h: torch.Tensor, dh: torch.Tensor, g_next: torch.Tensor | None,
              u: torch.Tensor, alpha_x: torch.Tensor | None, rstd_x: torch.Tensor | None
              ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """A deferring mix's own backward: ``(dx, du, c)``. ``x``: the running sum (a source without deferral) or
    ``None``; ``h``, ``dh``: the mix's output and its gradient ``[M, D]`` (``x``'s dtype); ``g_next``: the later
    running sum's gradient, added to ``dx`` (or ``None``); ``alpha_x`` / ``rstd_x``: ``x``'s fp32 ``[M]`` rows.
    ``dx`` (new, ``x``'s dtype) and fp32 ``du [D]`` are ``None`` without ``x``; ``c = dh . h`` fp32 ``[M]``."""
    m, d = h.shape
    c = torch.empty(m, device=h.device, dtype=torch.float32)
    block_t, chunk, ch = _row_blocks(d, h.element_size(), BWD_NUM_WARPS, LIGHT_MAX_CHUNKS, LIGHT_THREAD_ELEMS)
    num_tiles = triton.cdiv(m, block_t)
    programs = _num_bwd_programs(num_tiles, h.device)
    has_x, has_next = x is not None, x is not None and g_next is not None
    dx = torch.empty_like(h) if has_x else None
    du_partial = torch.empty(programs, d, device=h.device, dtype=torch.float32) if has_x else c
    x_, gn, dx_ = (x if has_x else h), (g_next if has_next else h), (dx if has_x else h)
    a_, r_ = (alpha_x, rstd_x) if has_x else (c, c)
    key = (h.dtype, aligned16(x_, h, dh, gn, dx_, u), m, d, num_tiles, block_t, chunk, ch, has_x, has_next,
           LIGHT_STAGES, BWD_NUM_WARPS)
    _LIGHT((programs,), key, x_, h, dh, gn, dx_, u, a_, r_, c, du_partial, m, d, num_tiles, block_t, chunk, ch,
           has_x, has_next, LIGHT_STAGES, num_warps=BWD_NUM_WARPS)
    return dx, (column_sum(du_partial) if has_x else None), c


def flush_dots(sources: list[torch.Tensor], bufs: list[torch.Tensor], acc_mask: int, dhs: list[torch.Tensor],
               us: list[torch.Tensor], alphas: list[torch.Tensor], rstds: list[torch.Tensor],
               cs: list[torch.Tensor]) -> torch.Tensor:
    """The gradients of ``C = len(sources)`` block states into ``bufs`` (bit ``n`` of ``acc_mask``: add to the
    content) from ``S = len(dhs)`` mixes; returns their queries' gradients from the states, fp32 ``[S, D]``."""
    from kernels.attn_res.mix_triton import MAX_ARGS

    if len(dhs) > MAX_ARGS or len(sources) > MAX_ARGS:
        raise ValueError(f"kernels/attn_res/defer_triton.py: a deferred block holds at most {MAX_ARGS} mixes and "
                         f"{MAX_ARGS} states, got {len(dhs)} and {len(sources)}")
    x0 = sources[0]
    m, d = x0.shape
    c, s = len(sources), len(dhs)
    k = torch.empty(s, c, m, device=x0.device, dtype=x0.dtype)
    block_t, chunk, ch = _row_blocks(d, x0.element_size(), FLUSH_NUM_WARPS, 4, FLUSH_DOTS_THREAD_ELEMS)
    key = (x0.dtype, aligned16(*sources, *bufs, *dhs, *us), m, d, c, s, block_t, chunk, ch, FLUSH_DOTS_GROUP,
           FLUSH_NUM_WARPS)
    _FLUSH_DOTS((triton.cdiv(m, block_t),), key, *_slots(sources), *_slots(bufs), *_slots(dhs), *_slots(us),
                *_slots(alphas), *_slots(rstds), *_slots(cs), k, m, d, acc_mask, c, s, block_t, chunk, ch,
                FLUSH_DOTS_GROUP, num_warps=FLUSH_NUM_WARPS)
    du = torch.zeros(s, d, device=x0.device, dtype=torch.float32)
    for n, x in enumerate(sources):
        du += _mm_f32(k[:, n], x)
    return du


def _mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` as fp32 (16-bit inputs on CUDA: accumulated and returned in fp32 where torch has ``out_dtype``)."""
    if a.dtype == torch.float32 or not a.is_cuda:
        return torch.mm(a.float(), b.float()) if a.dtype != torch.float32 else torch.mm(a, b)
    try:
        return torch.mm(a, b, out_dtype=torch.float32)
    except (TypeError, RuntimeError):
        return torch.mm(a, b).float()
