"""The AttnRes mix and the sublayer's input RMSNorm in one kernel, forward and backward (Triton; pointer-argument path
of ``mix_triton.py``, whose layout and helpers these kernels share).

The training stream mixes the sources into ``h`` and the next sublayer reads only ``y = w * rms_norm(h)``: nothing
else reads ``h``. Separately, a mix writes ``h`` and the norm's kernel reads it and writes ``y`` (forward), and the
norm's backward reads ``dy`` and ``h`` and writes ``dh`` for the mix's backward to read. Here:

- Forward: the mix's kernel normalises its ``h`` tile in registers (the row's sum of squares is a warp shuffle in
  the row layout) and writes ``y`` and the fp32 ``rstd(h) [M]`` instead of ``h``: two passes of ``[M, D]`` less a
  mix and no norm launch.
- Backward: the mix's kernel rebuilds ``h = sum_n alpha_n x_n`` from the source tiles it loads anyway, takes the
  norm's backward in registers (``dh`` from ``dy``; the gain's gradient accumulated per program beside the query's)
  and goes on as the mix's backward with that ``dh``. It stores ``dh`` only for a deferring mix (the block's flush
  reads it). Passes saved a mix: the norm's three and the mix's read of ``dh``, less the deferred mix's write.

Rounding: the forward follows the separate kernels (``h`` rounded to the sources' dtype before the norm, ``h * rstd``
rounded before the gain), so ``y`` and ``rstd(h)`` equal the mix then ``kernels/norm``'s norm up to the order of the
sums; the backward's rebuilt ``h`` stays fp32 (one rounding fewer than the norm's backward reading the stored ``h``) and
its ``dh`` is rounded to the sources' dtype, as the norm's kernel stores it, before the mix's part uses it. In fp32 the
fused kernels equal the two kernels run one after the other to ~1e-7 (``tests/kernels/test_attn_res_mix_norm.py``).

Measured (H200, small flavor 8 x 4096, bf16; ``docs/results/gpu-2026-11-30-s35/``): per kernel see ``MAX_SOURCES``;
in the block-AttnRes training step (18 of its 24 mixes have at most 4 sources) the sublayer norms' kernels 2.06 ->
0.86 ms and the mixes' 3.79 -> 4.58 ms (``bench_attnres --profile``, session 35 call2, round a).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attn_res import mix_triton as mt
from kernels.attn_res.mix_triton import (
    _defer_grad,
    _dots,
    _load_row,
    _load_vec,
    _pick,
    _prefetch,
    _rows_mix,
    _store_alpha,
    _store_du,
    _to_f32,
    _write_grad,
    _zeros_row,
)
from kernels.attn_res.sinks import GradSink, sink_buffers
from kernels.colsum import column_sum
from kernels.fast_launch import CompiledLaunch, aligned16


@triton.jit
def _mix_norm_fwd_kernel(
    x0, x1, x2, x3, x4, x5, x6, x7, u_ptr, nw_ptr, y_ptr, hr_ptr, rstd_ptr, alpha_ptr, N: tl.constexpr, M, D, eps,
    norm_eps, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, CH: tl.constexpr, PRE: tl.constexpr = 1,
):
    """``mix_triton._attn_res_fwd_rows_kernel`` followed by the RMSNorm of its ``h`` (gain ``nw``): stores ``y``,
    ``rstd(h)`` and the mix's ``rstd [N, M]`` and ``alpha [N, M]``; ``h`` itself is never stored."""
    offs_t, t_ok, rows, acc, inv_l, m, scores = _rows_mix(x0, x1, x2, x3, x4, x5, x6, x7, u_ptr, rstd_ptr, N, M, D,
                                                          eps, BLOCK_T, CHUNK, CH, PRE)
    hs, ss = (), tl.zeros([BLOCK_T], dtype=tl.float32)
    for c in tl.static_range(CH):  # h rounded as the mix would store it, then the norm's sum of squares
        hc = (acc[c] * inv_l[:, None]).to(x0.dtype.element_ty).to(tl.float32)
        hs = hs + (hc,)
        ss += tl.sum(hc * hc, axis=1)
    hr = tl.math.rsqrt(ss / D + norm_eps)
    tl.store(hr_ptr + offs_t, hr, mask=t_ok)
    for c in tl.static_range(CH):
        cols = c * CHUNK + tl.arange(0, CHUNK)
        nw = tl.load(nw_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
        y = nw[None, :] * (hs[c] * hr[:, None]).to(x0.dtype.element_ty).to(tl.float32)
        tl.store(y_ptr + rows + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=t_ok[:, None] & (cols < D)[None, :])
    _store_alpha(alpha_ptr, scores, m, inv_l, offs_t, t_ok, N, M)


@triton.jit
def _mixed_chunk(win, alphas, c: tl.constexpr, N: tl.constexpr):
    """Chunk ``c`` of ``h = sum_n alpha_n x_n`` (fp32) from the source tiles ``win``."""
    hc = alphas[0][:, None] * win[0][c].to(tl.float32)
    for n in tl.static_range(1, N):
        hc += alphas[n][:, None] * win[n][c].to(tl.float32)
    return hc


@triton.jit
def _norm_grad(win, alphas, dy, nw_ptr, hr, dg, N: tl.constexpr, CH: tl.constexpr, CHUNK: tl.constexpr, D,
               dtype: tl.constexpr):
    """The RMSNorm's backward for a tile whose input ``h = sum_n alpha_n x_n`` is rebuilt from the source tiles
    ``win``, a chunk at a time (twice: for the row's sum, then for ``dh``; no ``[BLOCK_T, D]`` copy of ``h`` stays
    live): ``(dh, dg)``, ``dh`` rounded to ``dtype`` (as the norm's kernel would store it), ``dg`` the gain's
    per-thread gradient updated. The gain is read per tile (L1) rather than held in registers."""
    nw = _to_f32(_load_vec(nw_ptr, D, CH, CHUNK), CH)
    p = dy[0] * nw[0][None, :] * _mixed_chunk(win, alphas, 0, N)
    for c in tl.static_range(1, CH):
        p += dy[c] * nw[c][None, :] * _mixed_chunk(win, alphas, c, N)
    dot = tl.sum(p, axis=1) * hr * hr / D
    dh, dg_new = (), ()
    for c in tl.static_range(CH):
        x_hat = _mixed_chunk(win, alphas, c, N) * hr[:, None]
        dg_new = dg_new + (dg[c] + dy[c] * x_hat.to(dtype).to(tl.float32),)
        dh = dh + ((hr[:, None] * dy[c] * nw[c][None, :] - x_hat * dot[:, None]).to(dtype).to(tl.float32),)
    return dh, dg_new


@triton.jit(do_not_specialize=["acc_mask"])
def _mix_norm_bwd_kernel(
    x0, x1, x2, x3, x4, x5, x6, x7, g0, g1, g2, g3, g4, g5, g6, g7,
    u_ptr, nw_ptr, dy_ptr, hr_ptr, dh_ptr, rstd_ptr, alpha_ptr, du_ptr, N: tl.constexpr, M, D, num_tiles, acc_mask,
    coef_ptr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, CH: tl.constexpr, DEFER: tl.constexpr,
    STAGES: tl.constexpr = 1, STORE_DH: tl.constexpr = False,
):
    """``mix_triton._attn_res_bwd_args_kernel`` with the norm's backward first (:func:`_norm_grad`): reads ``dy``
    (the gradient of ``y``) instead of ``dh``; ``STORE_DH``: ``dh`` is stored (a deferring mix's flush reads it).
    Per-program partial sums ``du_ptr [programs, 2, D]``: the query's, then the norm gain's."""
    pid = tl.program_id(0)
    u = _load_vec(u_ptr, D, CH, CHUNK)
    du = _zeros_row(BLOCK_T, CH, CHUNK)
    dg = _zeros_row(BLOCK_T, CH, CHUNK)
    for tile in tl.range(pid, num_tiles, tl.num_programs(0), num_stages=STAGES):
        offs_t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = offs_t < M
        rows = offs_t.to(tl.int64)[:, None] * D
        win = ()
        for j in tl.static_range(N):
            win = _prefetch(win, j, N, x0, x1, x2, x3, x4, x5, x6, x7, rows, t_ok, D, CH, CHUNK)
        alphas, rstds = (), ()
        for n in tl.static_range(N):
            alphas = alphas + (tl.load(alpha_ptr + n * M + offs_t, mask=t_ok, other=0.0),)
            rstds = rstds + (tl.load(rstd_ptr + n * M + offs_t, mask=t_ok, other=0.0),)
        dy = _to_f32(_load_row(dy_ptr, rows, t_ok, D, CH, CHUNK), CH)
        hr = tl.load(hr_ptr + offs_t, mask=t_ok, other=0.0)
        dh, dg = _norm_grad(win, alphas, dy, nw_ptr, hr, dg, N, CH, CHUNK, D, x0.dtype.element_ty)
        if STORE_DH:
            for c in tl.static_range(CH):
                cols = c * CHUNK + tl.arange(0, CHUNK)
                tl.store(dh_ptr + rows + cols[None, :], dh[c].to(dh_ptr.dtype.element_ty),
                         mask=t_ok[:, None] & (cols < D)[None, :])
        big_g = tl.zeros([BLOCK_T], dtype=tl.float32)
        gs, qs = (), ()
        for n in tl.static_range(N):  # pass A: per-token dot products
            g, q = _dots(dh, win[n], u, CH)
            big_g += alphas[n] * g
            gs, qs = gs + (g,), qs + (q,)
        for n in tl.static_range(N):  # pass B: gradients, no reductions
            if (DEFER >> n) & 1:
                du = _defer_grad(win[n], du, coef_ptr + n * 3 * M, offs_t, t_ok, alphas[n], rstds[n], gs[n], qs[n],
                                 big_g, M, D, CH)
            else:
                du = _write_grad(win[n], dh, u, du, _pick(n, g0, g1, g2, g3, g4, g5, g6, g7), rows, t_ok,
                                 ((acc_mask >> n) & 1) != 0, alphas[n], rstds[n], gs[n], qs[n], big_g, D, CH, CHUNK)
    _store_du(du_ptr + pid * 2 * D, du, D, CH, CHUNK)
    _store_du(du_ptr + pid * 2 * D + D, dg, D, CH, CHUNK)


# The stream fuses a mix with its norm only up to MAX_SOURCES sources: beyond, the fused backward spills (ptxas sm_90a:
# 255 registers, 92 / 260 bytes of spills at N = 4 / 5) and was slower than the two kernels. H200, M = 32768, D = 768,
# bf16, CUDA graphs (session 35 call1, bench_mix_norm.py), separate -> fused ms: forward 0.064 -> 0.040 / 0.077 ->
# 0.061 / 0.092 -> 0.092 / 0.103 -> 0.110 at N = 2 / 3 / 4 / 5; a deferring mix's backward 0.128 -> 0.105 / 0.139 ->
# 0.117 / 0.152 -> 0.143 / 0.164 -> 0.188 (at the stages below; 0.203 at two at N = 5); a mix writing every gradient
# 0.140 -> 0.103 / 0.157 -> 0.129 / 0.182 -> 0.164 / 0.212 -> 0.254.
MAX_SOURCES = 4
# the fused backward's software-pipelining stages by (N, deferring), else 1 (mix_triton.bwd_stages caps them by shared
# memory). Call1, one stage against two: deferring mixes 0.105 / 0.117 / 0.152 ms against 0.104 / 0.121 / 0.143 at
# N = 2 / 3 / 4; mixes writing every gradient 0.103 / 0.129 / 0.164 against 0.105 / 0.135 / 0.200.
BWD_STAGES = {(4, True): 2}


def fusable(n: int) -> bool:
    """Whether a mix over ``n`` sources takes the fused kernels (the pointer-argument path, ``n <= MAX_SOURCES``)."""
    return n <= MAX_SOURCES and mt.use_args(n)


_FWD = CompiledLaunch(_mix_norm_fwd_kernel)
_BWD = CompiledLaunch(_mix_norm_bwd_kernel)


def _check_args(n: int) -> None:
    if not mt.use_args(n):  # (any N the pointer-argument path takes runs: MAX_SOURCES is the stream's choice)
        raise ValueError(f"kernels/attn_res/mix_norm_triton.py: the mix with its norm takes the pointer-argument path "
                         f"(N <= {mt.MAX_ARGS}, KVL_ATTNRES_ADDRESSING=args), got N={n}")


def mix_norm_fwd_triton(sources: list[torch.Tensor], u: torch.Tensor, eps: float, norm_weight: torch.Tensor,
                        norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sources``: N contiguous ``[M, D]`` of one dtype; ``u = w * gain`` fp32 ``[D]``; the sublayer's RMSNorm gain
    ``norm_weight [D]`` (any float dtype) and epsilon.

    Returns ``y = rms_norm(mix(sources)) [M, D]`` (the promoted dtype of the sources and the gain, as
    ``kernels.norm.rms_norm``), fp32 ``rstd(h) [M]``, the mix's fp32 ``rstd [N,
    M]`` and ``alpha [N, M]``."""
    x0 = sources[0]
    n, (m, d) = len(sources), x0.shape
    _check_args(n)
    nw = norm_weight.contiguous()
    y = torch.empty(m, d, device=x0.device, dtype=x0.dtype if nw.dtype == x0.dtype else torch.promote_types(
        x0.dtype, nw.dtype))  # what kernels.norm.rms_norm gives for h and this gain
    hr = torch.empty(m, device=x0.device, dtype=torch.float32)
    rstd = torch.empty(n, m, device=x0.device, dtype=torch.float32)
    alpha = torch.empty(n, m, device=x0.device, dtype=torch.float32)
    block_t, chunk, ch = mt._row_blocks(d, x0.element_size(), mt.FWD_NUM_WARPS, mt.FWD_MAX_CHUNKS,
                                        mt.FWD_THREAD_ELEMS)
    key = (x0.dtype, nw.dtype, y.dtype, aligned16(*sources, u, nw), n, m, d, block_t, chunk, ch, mt.FWD_PREFETCH,
           mt.FWD_NUM_WARPS)
    _FWD((triton.cdiv(m, block_t),), key, *mt._slots(sources), u, nw, y, hr, rstd, alpha, n, m, d, float(eps),
         float(norm_eps), block_t, chunk, ch, mt.FWD_PREFETCH, num_warps=mt.FWD_NUM_WARPS)
    return y, hr, rstd, alpha


def mix_norm_bwd_triton(sources: list[torch.Tensor], u: torch.Tensor, norm_weight: torch.Tensor, dy: torch.Tensor,
                        hr: torch.Tensor, rstd: torch.Tensor, alpha: torch.Tensor,
                        sinks: list[GradSink | None] | None = None, defer: int = 0, store_dh: bool = False
                        ) -> tuple[list[torch.Tensor | None], torch.Tensor, torch.Tensor, torch.Tensor | None,
                                   torch.Tensor | None]:
    """Gradients of :func:`mix_norm_fwd_triton` from ``dy [M, D]`` (contiguous, any float dtype): ``(dxs, du, dw,
    coef, dh)`` with
    ``dxs``, ``du`` and ``coef`` as ``mix_triton.mix_bwd_triton`` gives them (sinks, deferred sources), ``dw`` the
    norm gain's gradient in its dtype, and ``dh [M, D]`` (the mix output's gradient) with ``store_dh``, else
    ``None``."""
    x0 = sources[0]
    n, (m, d) = len(sources), x0.shape
    _check_args(n)
    task = torch._C._current_graph_task_id() if sinks is not None else -1
    dxs, acc_mask = sink_buffers(list(sinks or [None] * n), x0, task, skip=defer)
    coef = torch.empty(n, 3, m, device=x0.device, dtype=torch.float32) if defer else None
    dh = torch.empty_like(x0) if store_dh else None
    nw = norm_weight.contiguous()
    block_t, chunk, ch = mt._row_blocks(d, x0.element_size(), mt.BWD_NUM_WARPS, mt.BWD_MAX_CHUNKS,
                                        mt.BWD_THREAD_ELEMS)
    num_tiles = triton.cdiv(m, block_t)
    programs = mt._num_bwd_programs(num_tiles, x0.device)
    partial = torch.empty(programs, 2, d, device=x0.device, dtype=torch.float32)
    stages = mt.bwd_stages(n, block_t, chunk, ch, x0.element_size()) if BWD_STAGES.get((n, defer != 0), 1) > 1 else 1
    key = (x0.dtype, nw.dtype, dy.dtype, aligned16(*sources, u, nw, dy), n, m, d, num_tiles, block_t, chunk, ch, defer,
           store_dh, mt.BWD_NUM_WARPS, mt.BWD_MAXNREG, stages)
    _BWD((programs,), key, *mt._slots(sources), *mt._slots(dxs), u, nw, dy, hr, x0 if dh is None else dh, rstd,
         alpha, partial, n, m, d, num_tiles, acc_mask, alpha if coef is None else coef, block_t, chunk, ch, defer,
         stages, store_dh, num_warps=mt.BWD_NUM_WARPS,
         **mt._maxnreg())
    du, dw = column_sum(partial).unbind(0)
    return [None if (defer >> i) & 1 else dx for i, dx in enumerate(dxs)], du, dw.to(nw.dtype), coef, dh
