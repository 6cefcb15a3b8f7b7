"""Fused Triton kernels for the Attention-Residual mix over depth, forward and backward (GPU; also runs under
``TRITON_INTERPRET=1``). Maths of ``naive.py`` (the spec), gradients as in ``mix_torch.py``.

Shapes: ``M`` tokens (all leading dims flattened), ``D`` features, ``N`` sources ``x_n [M, D]`` (contiguous,
one dtype: fp32, fp16 or bf16), read in place through a table of their addresses (``int64 [N]``), so the
sources are never stacked and one compiled kernel serves every ``N`` (when every address is 16-byte aligned,
``ALIGNED`` tells the compiler so, since it cannot see through the table, and loads vectorise).

- Forward: one program per tile of ``BLOCK_T`` tokens x all of ``D`` (``BLOCK_D`` = next power of two) walks
  the sources once with an online softmax: per source, RMS and score in fp32, then ``acc = acc * e^(m - m') +
  e^(s - m') x``. Writes ``h [M, D]``, fp32 ``rstd [N, M]``, scores ``s [N, M]`` and ``lse [M]``; the
  wrapper turns ``s`` into ``alpha = exp(s - lse)`` in place (saved for backward, returned for diagnostics).
- Backward: grid-stride over token tiles. Pass A reads every source once to rebuild ``h = sum_n alpha_n x_n`` in
  fp32; pass B re-reads each source (mostly from L2: a tile is small), recomputes its key and score and writes
  ``dx_n = alpha_n dh + ds_n rstd_n (u - n_n (u . n_n) / D)`` with ``ds_n = alpha_n dh . (x_n - h)`` (equal to
  ``alpha_n (dh . x_n - sum_j alpha_j dh . x_j)`` without that form's cancellation of large dot products); the
  query gradient ``du = sum ds_n n_n`` is accumulated per program in fp32 and summed afterwards (no atomics,
  deterministic).

Two ways to reach the sources (``KVL_ATTNRES_ADDRESSING``):

- ``args`` (default for ``N <= MAX_ARGS``): each source is its own pointer argument (``MAX_ARGS`` slots, unused
  ones repeat ``sources[0]`` and are skipped by a runtime ``n < N`` branch), so a launch copies nothing to the
  device and never synchronises; one compiled kernel per dtype serves every ``N <= MAX_ARGS``, and Triton's
  own 16-byte alignment specialisation of pointer arguments vectorises the loads.
- ``table`` (always used for ``N > MAX_ARGS``, e.g. full AttnRes): the addresses go to the device as an
  ``int64 [N]`` table through pinned memory (the first version of these kernels; kept for many sources and
  so that the benchmark can time it).

Fixed launch configurations (no autotuning): ``BLOCK_T * BLOCK_D = TILE_ELEMS``, ``NUM_WARPS`` warps.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

TILE_ELEMS = 4096
NUM_WARPS = 8
MAX_D = 16384
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_ARGS = 8
ADDRESSING = ("args", "table")


@triton.jit
def _attn_res_fwd_kernel(
    src_tab, u_ptr, h_ptr, rstd_ptr, score_ptr, lse_ptr, N, M, D, eps,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, ALIGNED: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    t_ok = offs_t < M
    d_ok = offs_d < D
    tile_ok = t_ok[:, None] & d_ok[None, :]
    offs = offs_t.to(tl.int64)[:, None] * D + offs_d[None, :]
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
        tl.store(score_ptr + n * M + offs_t, s, mask=t_ok)
        m_new = tl.maximum(m, s)
        scale = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        acc = acc * scale[:, None] + p[:, None] * x
        l = l * scale + p
        m = m_new
    h = acc / l[:, None]
    tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=tile_ok)
    tl.store(lse_ptr + offs_t, m + tl.log(l), mask=t_ok)


@triton.jit
def _attn_res_bwd_kernel(
    src_tab, dsrc_tab, u_ptr, dh_ptr, rstd_ptr, alpha_ptr, du_ptr, N, M, D, num_tiles,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, ALIGNED: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    u = tl.load(u_ptr + offs_d, mask=d_ok, other=0.0)
    du = tl.zeros([BLOCK_D], dtype=tl.float32)
    for tile in range(pid, num_tiles, tl.num_programs(0)):
        offs_t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = offs_t < M
        tile_ok = t_ok[:, None] & d_ok[None, :]
        offs = offs_t.to(tl.int64)[:, None] * D + offs_d[None, :]
        dh = tl.load(dh_ptr + offs, mask=tile_ok, other=0.0).to(tl.float32)
        h = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for n in range(N):
            src = tl.load(src_tab + n).to(dh_ptr.dtype)
            if ALIGNED:
                src = tl.multiple_of(src, 16)
            x = tl.load(src + offs, mask=tile_ok, other=0.0).to(tl.float32)
            a = tl.load(alpha_ptr + n * M + offs_t, mask=t_ok, other=0.0)
            h += a[:, None] * x
        for n in range(N):
            src = tl.load(src_tab + n).to(dh_ptr.dtype)
            dsrc = tl.load(dsrc_tab + n).to(dh_ptr.dtype)
            if ALIGNED:
                src = tl.multiple_of(src, 16)
                dsrc = tl.multiple_of(dsrc, 16)
            x = tl.load(src + offs, mask=tile_ok, other=0.0).to(tl.float32)
            a = tl.load(alpha_ptr + n * M + offs_t, mask=t_ok, other=0.0)
            r = tl.load(rstd_ptr + n * M + offs_t, mask=t_ok, other=0.0)
            ds = a * tl.sum(dh * (x - h), axis=1)
            key = x * r[:, None]
            s = tl.sum(key * u[None, :], axis=1)
            dx = a[:, None] * dh + (ds * r)[:, None] * (u[None, :] - key * (s / D)[:, None])
            tl.store(dsrc + offs, dx.to(dh_ptr.dtype.element_ty), mask=tile_ok)
            du += tl.sum(ds[:, None] * key, axis=0)
    tl.store(du_ptr + pid * D + offs_d, du, mask=d_ok)


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
def _attn_res_fwd_args_kernel(
    x0, x1, x2, x3, x4, x5, x6, x7, u_ptr, h_ptr, rstd_ptr, score_ptr, lse_ptr, N, M, D, eps,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, NMAX: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    t_ok = offs_t < M
    d_ok = offs_d < D
    tile_ok = t_ok[:, None] & d_ok[None, :]
    offs = offs_t.to(tl.int64)[:, None] * D + offs_d[None, :]
    u = tl.load(u_ptr + offs_d, mask=d_ok, other=0.0)
    m = tl.full([BLOCK_T], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for n in tl.static_range(NMAX):
        if N > n:  # N a runtime scalar tensor, n a constant: the tensor on the left
            src = _pick(n, x0, x1, x2, x3, x4, x5, x6, x7)
            x = tl.load(src + offs, mask=tile_ok, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
            s = tl.sum(x * u[None, :], axis=1) * rstd
            tl.store(rstd_ptr + n * M + offs_t, rstd, mask=t_ok)
            tl.store(score_ptr + n * M + offs_t, s, mask=t_ok)
            m_new = tl.maximum(m, s)
            scale = tl.exp(m - m_new)
            p = tl.exp(s - m_new)
            acc = acc * scale[:, None] + p[:, None] * x
            l = l * scale + p
            m = m_new
    h = acc / l[:, None]
    tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=tile_ok)
    tl.store(lse_ptr + offs_t, m + tl.log(l), mask=t_ok)


@triton.jit(do_not_specialize=["acc_mask"])
def _attn_res_bwd_args_kernel(
    x0, x1, x2, x3, x4, x5, x6, x7, g0, g1, g2, g3, g4, g5, g6, g7,
    u_ptr, dh_ptr, rstd_ptr, alpha_ptr, du_ptr, N, M, D, num_tiles, acc_mask,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, NMAX: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    u = tl.load(u_ptr + offs_d, mask=d_ok, other=0.0)
    du = tl.zeros([BLOCK_D], dtype=tl.float32)
    for tile in range(pid, num_tiles, tl.num_programs(0)):
        offs_t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = offs_t < M
        tile_ok = t_ok[:, None] & d_ok[None, :]
        offs = offs_t.to(tl.int64)[:, None] * D + offs_d[None, :]
        dh = tl.load(dh_ptr + offs, mask=tile_ok, other=0.0).to(tl.float32)
        h = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for n in tl.static_range(NMAX):
            if N > n:  # N a runtime scalar tensor, n a constant: the tensor on the left
                src = _pick(n, x0, x1, x2, x3, x4, x5, x6, x7)
                x = tl.load(src + offs, mask=tile_ok, other=0.0).to(tl.float32)
                a = tl.load(alpha_ptr + n * M + offs_t, mask=t_ok, other=0.0)
                h += a[:, None] * x
        for n in tl.static_range(NMAX):
            if N > n:  # N a runtime scalar tensor, n a constant: the tensor on the left
                src = _pick(n, x0, x1, x2, x3, x4, x5, x6, x7)
                dsrc = _pick(n, g0, g1, g2, g3, g4, g5, g6, g7)
                x = tl.load(src + offs, mask=tile_ok, other=0.0).to(tl.float32)
                a = tl.load(alpha_ptr + n * M + offs_t, mask=t_ok, other=0.0)
                r = tl.load(rstd_ptr + n * M + offs_t, mask=t_ok, other=0.0)
                ds = a * tl.sum(dh * (x - h), axis=1)
                key = x * r[:, None]
                s = tl.sum(key * u[None, :], axis=1)
                dx = a[:, None] * dh + (ds * r)[:, None] * (u[None, :] - key * (s / D)[:, None])
                if ((acc_mask >> n) & 1) != 0:  # a shared gradient buffer: add to what later mixes wrote
                    dx += tl.load(dsrc + offs, mask=tile_ok, other=0.0).to(tl.float32)
                tl.store(dsrc + offs, dx.to(dh_ptr.dtype.element_ty), mask=tile_ok)
                du += tl.sum(ds[:, None] * key, axis=0)
    tl.store(du_ptr + pid * D + offs_d, du, mask=d_ok)


@functools.lru_cache(maxsize=64)
def _blocks(d: int) -> tuple[int, int]:
    block_d = triton.next_power_of_2(d)
    return max(1, TILE_ELEMS // block_d), block_d


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
    return min(num_tiles, 8 * torch.cuda.get_device_properties(device).multi_processor_count)


class GradSink:
    """The gradient of one source that several mixes read (a completed block state), accumulated in place.

    Autograd would take one ``dx`` tensor from every mix that reads the source and add them (write ``dx``, then
    read two and write one per extra mix). With a sink, the backward kernels add into one buffer instead (read
    and write it once per mix), and only the first mix in forward order, which is the last to run backward
    (every later mix reads a sum that depends on its output), returns the buffer to autograd; the others
    return no gradient for that source. A buffer is tied to the backward pass (autograd graph task) that
    started it, so a pass that skipped the returning mix (gradients of a subset of inputs) leaves nothing behind
    for the next one."""

    __slots__ = ("buf", "task", "uses")

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.task = -1  # the autograd graph task that started ``buf``: a buffer left by another pass is stale
        self.uses = 0


def mix_fwd_triton(sources: list[torch.Tensor], u: torch.Tensor, eps: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sources``: N contiguous ``[M, D]`` of one dtype; ``u = w * gain`` fp32 ``[D]``.

    Returns ``h [M, D]`` (source dtype), fp32 ``rstd [N, M]`` and ``alpha [N, M]``."""
    x0 = sources[0]
    n, (m, d) = len(sources), x0.shape
    h = torch.empty_like(x0)
    rstd = torch.empty(n, m, device=x0.device, dtype=torch.float32)
    alpha = torch.empty(n, m, device=x0.device, dtype=torch.float32)
    lse = torch.empty(m, device=x0.device, dtype=torch.float32)
    block_t, block_d = _blocks(d)
    grid = (triton.cdiv(m, block_t),)
    if use_args(n):
        _attn_res_fwd_args_kernel[grid](
            *_slots(sources), u, h, rstd, alpha, lse, n, m, d, eps,
            BLOCK_T=block_t, BLOCK_D=block_d, NMAX=MAX_ARGS, num_warps=NUM_WARPS)
    else:
        _attn_res_fwd_kernel[grid](
            _address_table(sources, x0.device), u, h, rstd, alpha, lse, n, m, d, eps,
            BLOCK_T=block_t, BLOCK_D=block_d, ALIGNED=_aligned(sources), num_warps=NUM_WARPS)
    alpha.sub_(lse).exp_()
    return h, rstd, alpha


def mix_bwd_triton(sources: list[torch.Tensor], u: torch.Tensor, dh: torch.Tensor, rstd: torch.Tensor,
                   alpha: torch.Tensor, sinks: list[GradSink | None] | None = None
                   ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Gradients ``dx_n [M, D]`` (source dtype) and ``du [D]`` fp32, ``dh [M, D]`` in the source dtype.

    With ``sinks`` (pointer-argument path only), source ``n`` with a sink gets its gradient added into the
    sink's buffer in the kernel (the buffer is started by the first mix to run backward), and ``dx_n`` is
    that buffer."""
    x0 = sources[0]
    n, (m, d) = len(sources), x0.shape
    dxs, acc_mask = [], 0
    task = torch._C._current_graph_task_id() if sinks is not None else -1
    for i, sink in enumerate(sinks or [None] * n):
        if sink is None:
            dxs.append(torch.empty_like(x0))
        elif sink.buf is None or sink.task != task:
            sink.buf, sink.task = torch.empty_like(x0), task
            dxs.append(sink.buf)
        else:
            dxs.append(sink.buf)
            acc_mask |= 1 << i
    block_t, block_d = _blocks(d)
    num_tiles = triton.cdiv(m, block_t)
    programs = _num_bwd_programs(num_tiles, x0.device)
    du_partial = torch.empty(programs, d, device=x0.device, dtype=torch.float32)
    if use_args(n):
        _attn_res_bwd_args_kernel[(programs,)](
            *_slots(sources), *_slots(dxs), u, dh, rstd, alpha, du_partial, n, m, d, num_tiles, acc_mask,
            BLOCK_T=block_t, BLOCK_D=block_d, NMAX=MAX_ARGS, num_warps=NUM_WARPS)
    else:
        if acc_mask:
            raise ValueError(f"kernels/attn_res/mix_triton.py: gradient sinks need the pointer-argument path "
                             f"(N <= {MAX_ARGS}, KVL_ATTNRES_ADDRESSING=args), got N={n}")
        _attn_res_bwd_kernel[(programs,)](
            _address_table(sources, x0.device), _address_table(dxs, x0.device), u, dh, rstd, alpha, du_partial,
            n, m, d, num_tiles, BLOCK_T=block_t, BLOCK_D=block_d, ALIGNED=_aligned(sources + dxs),
            num_warps=NUM_WARPS)
    return dxs, du_partial.sum(0)


class AttnResMixTriton(torch.autograd.Function):
    """``apply(weight [1, D] or [D], gain [D], eps, sinks, *sources [M, D]) -> (h [M, D], alpha [N, M] fp32)``.

    Sources must be contiguous, of one dtype in :data:`DTYPES` and on one device (the public wrapper
    ``kernels.attn_res.attn_res_mix`` checks, casts and flattens). ``sinks``: ``None`` or one
    :class:`GradSink` or ``None`` per source (used only on the pointer-argument path)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, gain: torch.Tensor, eps: float, sinks, *sources: torch.Tensor):
        u = (weight.float().reshape(-1) * gain.float()).contiguous()
        h, rstd, alpha = mix_fwd_triton(list(sources), u, eps)
        ctx.save_for_backward(weight, gain, rstd, alpha, *sources)
        ctx.mark_non_differentiable(alpha)
        ctx.sinks, ctx.returns = None, None
        if sinks is not None and any(s is not None for s in sinks) and use_args(len(sources)):
            ctx.sinks = list(sinks)
            ctx.returns = [s is not None and s.uses == 0 for s in sinks]
            for s in sinks:
                if s is not None:
                    s.uses += 1
        return h, alpha

    @staticmethod
    def backward(ctx, dh: torch.Tensor, _dalpha: torch.Tensor | None):
        weight, gain, rstd, alpha, *sources = ctx.saved_tensors
        u = (weight.float().reshape(-1) * gain.float()).contiguous()
        dh = dh.to(sources[0].dtype).contiguous()
        dxs, du = mix_bwd_triton(sources, u, dh, rstd, alpha, ctx.sinks)
        dweight = (du * gain.float()).reshape(weight.shape).to(weight.dtype)
        dgain = (du * weight.float().reshape(-1)).to(gain.dtype)
        grads = []
        for i, dx in enumerate(dxs):
            sink = None if ctx.sinks is None else ctx.sinks[i]
            if sink is not None:
                dx = dx if ctx.returns[i] else None
                if ctx.returns[i]:
                    sink.buf = None  # released: the next backward pass starts a new buffer
            grads.append(dx if ctx.needs_input_grad[4 + i] else None)
        return dweight, dgain, None, None, *grads
