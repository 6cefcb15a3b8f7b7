"""Two-phase block Attention-Residual inference in Triton (``../shared/REFERENCE.md`` s. 3; the PyTorch form is
``phase1`` / ``phase2`` in ``kimi_vl/modeling/attn_res.py``, which these kernels must equal).

The block states live in one contiguous buffer ``v [K, M, D]`` (``kimi_vl``'s ``BufferedTwoPhase``: slot 0 the
embedding, slot ``k`` the ``k``-th completed block, the last slot the current block's running sum), the queries'
parameters are read through a :class:`QueryTable` (``u = w * gain`` formed in the kernels). Both kernels index
them in-kernel, and each also absorbs the previous sublayer's output into a running sum (``run += out`` in the
buffer's dtype, or ``run = out`` for a block's first sublayer; phase 1 stores the completed sum in its own slot),
so a sublayer costs exactly one launch, as the standard residual's add does: decode (``M = batch`` tokens) is
bound by launches, not bandwidth. Both can also apply the sublayer's input RMSNorm to ``h`` (``norm``).

- ``phase1`` (a block's first sublayer): for the queries ``q0 .. q0 + S - 1`` of the block and its completed
  slots ``0 .. N - 1``, per token (fp32): ``s_qn = u_q . x_n * rstd(x_n)``, ``m_q = max_n s_qn``,
  ``l_q = sum_n e^(s_qn - m_q)``, ``o_q = sum_n e^(s_qn - m_q) x_n`` (unnormalised), and the first query's mix
  ``h = o_0 / l_0``. One program per tile of tokens walks the ``S`` queries, each over the ``N`` slots with an
  online softmax; the tile's slots are re-read from L1/L2, not HBM. For few tokens (decode, at most
  ``ROWS_MAX_TOKENS``) a program loads all of a token's slots at once and scores a query against them in one
  reduction (``_phase1_rows_kernel``), one program per (token, query) where race-free (one token, 6 queries, 5
  slots, H100: 2.6 us; one program per token walking the queries 6.3 us; the tiled kernel 21.6 us).
- ``phase2`` (sublayer ``j >= 1``): merges its own partial sum ``p`` (slot ``k``): ``s = u . p * rstd(p)``,
  ``m' = max(m, s)``, ``h = (o e^(m - m') + p e^(s - m')) / (l e^(m - m') + e^(s - m'))``, ``h`` in the
  buffer's dtype; one token a program in decode (``PHASE2_DECODE_ROWS``).

Decode is latency-bound, so the kernels keep their critical path short: a score's two row sums are one reduction
(``_score``), the norm gain and a query's parameter addresses are loaded before the reductions (``_load_gain``),
and the embedding reaches slot 0 as the first phase 1's pending output rather than by a copy. Phase 2 with the norm
at one token: 1.95 us against 1.47 us for the standard residual's ``add_rms_norm`` (H100, session 17 call2-3).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attn_res.mix_triton import NUM_WARPS, _blocks, _online_softmax_step, _token_tile
from kernels.fast_launch import CompiledLaunch

_WHERE = "kernels/attn_res/two_phase_triton.py"
PHASE2_NUM_WARPS = 8  # one decode token (bench_two_phase.py, session 16 call3): 1 warp 2.41 us, 2 2.29, 4 2.01, 8 1.94;
# with the input norm in the kernel 3.40, 3.47, 2.62, 2.46 (session 15 call8: 2 warps 2.35, 4 2.03, 8 2.02)
PHASE2_DECODE_ROWS = 1  # tokens per phase-2 program in decode (at most ROWS_MAX_TOKENS tokens); 0: the tiled layout's
ROWS_MAX_TOKENS = 64  # phase 1 over at most this many tokens (decode) runs one program per token (_phase1_rows_kernel)
ROWS_MAX_ELEMS = 16384  # ... when a token's slots fit one tile of this many elements (registers)
ROWS_QUERY_PROGRAMS = True  # decode phase 1: one program per (token, query) where race-free (see _phase1_rows_kernel)
ROWS_NUM_WARPS = 4  # one token, 6 queries over 5 slots at D = 768 (H100, graph-timed, bench_two_phase.py, session 15
# call6): 1 warp 8.3 us, 2 7.3, 4 6.3, 8 14.0; the tiled kernel 21.6 (a phase 2 launch 1.9, a torch.add 1.6)


@triton.jit
def _absorb(v_ptr, pend_ptr, src_off, dst_off, offs, tile_ok, PEND_FIRST: tl.constexpr, STORE):
    """The pending sublayer output added to the running sum in slot ``src`` (or alone, ``PEND_FIRST``), stored in
    slot ``dst`` when ``STORE`` (``src == dst``: in place); returns the new tile in fp32 (kept in registers: the
    caller must not re-load it)."""
    pend = tl.load(pend_ptr + offs, mask=tile_ok, other=0.0)
    if PEND_FIRST:
        new = pend
    else:
        new = (tl.load(v_ptr + src_off + offs, mask=tile_ok, other=0.0).to(tl.float32) + pend.to(tl.float32))
    new = new.to(v_ptr.dtype.element_ty)
    if STORE:
        tl.store(v_ptr + dst_off + offs, new, mask=tile_ok)
    return new.to(tl.float32)


@triton.jit
def _load_gain(nw_ptr, offs_d, d_ok, NORM: tl.constexpr):
    """The input norm's gain (fp32 ``[BLOCK_D]``; zeros without ``NORM``). Loaded at a kernel's start: a load placed
    after a reduction waits for it (no load moves across the reduction's barrier), which cost a memory latency on the
    critical path."""
    if NORM:
        return tl.load(nw_ptr + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    return tl.zeros(offs_d.shape, dtype=tl.float32)


@triton.jit
def _store_h(h_ptr, offs, mask, h, nw, D, norm_eps, NORM: tl.constexpr):
    """Store the mix ``h [T, BLOCK_D]`` (fp32) in ``h``'s dtype; with ``NORM`` its RMSNorm instead, as
    ``kernels.norm.rms_norm`` computes it on the stored ``h``: fp32 statistics of the rounded values, the normalised
    row cast back before the gain ``nw`` (:func:`_load_gain`)."""
    hb = h.to(h_ptr.dtype.element_ty)
    if NORM:
        x = hb.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + norm_eps)
        hb = (nw[None, :] * (x * rstd[:, None]).to(h_ptr.dtype.element_ty).to(tl.float32)).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + offs, hb, mask=mask)


@triton.jit
def _query_ptrs(qtab, w0_ptr, g0_ptr, q, Q, ALIGNED: tl.constexpr):
    """Addresses of query ``q``'s ``w`` and gain: ``qtab [2, Q]`` holds every query's (``w0`` / ``g0``: tensors of
    their dtypes, for the pointer types); a query past the end reads a valid address (its values are masked)."""
    row = tl.minimum(q, Q - 1)
    wp = tl.load(qtab + row).to(w0_ptr.dtype)
    gp = tl.load(qtab + Q + row).to(g0_ptr.dtype)
    if ALIGNED:
        wp = tl.multiple_of(wp, 16)
        gp = tl.multiple_of(gp, 16)
    return wp, gp


@triton.jit
def _load_u(wp, gp, q, offs_d, d_ok, q_end):
    """Query ``q``'s ``u = w * gain`` (fp32 ``[BLOCK_D]``; zeros unless ``q < q_end``) from its live parameters at
    ``wp`` / ``gp`` (:func:`_query_ptrs`)."""
    ok = d_ok & (offs_d * 0 + q < q_end)
    w = tl.load(wp + offs_d, mask=ok, other=0.0).to(tl.float32)
    return w * tl.load(gp + offs_d, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _add_pairs(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def _score(x, u, D, eps):
    """``u . x * rstd(x)`` per row of an fp32 tile: both row sums in one reduction (one round of shuffles and
    shared memory instead of two: these kernels are latency-bound in decode)."""
    xu, xx = tl.reduce((x * u[None, :], x * x), 1, _add_pairs)
    return xu * (1.0 / tl.sqrt(xx / D + eps))


@triton.jit(do_not_specialize=["n_src", "src", "q0", "n_q", "M"])
def _phase1_kernel(
    v_ptr, qtab, w0_ptr, g0_ptr, Q, o_ptr, m_ptr, l_ptr, h_ptr, pend_ptr, nw_ptr, n_src, src, q0, n_q, M,
    D: tl.constexpr, eps, norm_eps, PEND: tl.constexpr, PEND_FIRST: tl.constexpr, U_ALIGNED: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, NORM: tl.constexpr,
):
    offs_t, offs_d, t_ok, d_ok, tile_ok, offs = _token_tile(tl.program_id(0), M, D, BLOCK_T, BLOCK_D)
    nw = _load_gain(nw_ptr, offs_d, d_ok, NORM)
    slot = M.to(tl.int64) * D
    n_mem = n_src
    if PEND:
        n_mem = n_src - 1
        last = _absorb(v_ptr, pend_ptr, src.to(tl.int64) * slot, n_mem.to(tl.int64) * slot, offs, tile_ok, PEND_FIRST,
                       True)
    for q in range(n_q):
        wp, gp = _query_ptrs(qtab, w0_ptr, g0_ptr, q0 + q, Q, U_ALIGNED)
        u = _load_u(wp, gp, q0 + q, offs_d, d_ok, Q)
        m = tl.full([BLOCK_T], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_T], dtype=tl.float32)
        acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for n in range(n_mem):
            x = tl.load(v_ptr + n * slot + offs, mask=tile_ok, other=0.0).to(tl.float32)
            m, l, acc = _online_softmax_step(m, l, acc, _score(x, u, D, eps), x)
        if PEND:
            m, l, acc = _online_softmax_step(m, l, acc, _score(last, u, D, eps), last)
        tl.store(o_ptr + q * slot + offs, acc, mask=tile_ok)
        tl.store(m_ptr + q * M + offs_t, m, mask=t_ok)
        tl.store(l_ptr + q * M + offs_t, l, mask=t_ok)
        if q == 0:
            _store_h(h_ptr, offs, tile_ok, acc / l[:, None], nw, D, norm_eps, NORM)


@triton.jit
def _rows_query(x, rstd, valid, u, o_ptr, m_ptr, l_ptr, h_ptr, nw, q, n_q, t, M, slot, offs_d, d_ok, D, eps,
                norm_eps, NORM: tl.constexpr, JOINT: tl.constexpr):
    """Query ``q`` (its ``u``) of :func:`_phase1_rows_kernel` against a token's slots ``x [KP, BLOCK_D]`` (fp32,
    with their ``rstd``; ``valid`` rows): one reduction over D for the scores, one softmax over the slots.
    ``JOINT``: the slots' sums of squares are reduced together with the scores (``rstd`` unused)."""
    if JOINT:
        s = _score(x, u, D, eps)
    else:
        s = tl.sum(x * u[None, :], axis=1) * rstd
    s = tl.where(valid, s, float("-inf"))
    m = tl.max(s, axis=0)
    p = tl.exp(s - m)
    l = tl.sum(p, axis=0)
    o = tl.sum(p[:, None] * x, axis=0)
    if q < n_q:
        tl.store(o_ptr + q * slot + t * D + offs_d, o, mask=d_ok)
        tl.store(m_ptr + q * M + t, m)
        tl.store(l_ptr + q * M + t, l)
    if q == 0:
        _store_h(h_ptr, (t * D + offs_d)[None, :], d_ok[None, :], (o / l)[None, :], nw, D, norm_eps, NORM)


@triton.jit(do_not_specialize=["n_src", "src", "q0", "n_q", "M"])
def _phase1_rows_kernel(
    v_ptr, qtab, w0_ptr, g0_ptr, Q, o_ptr, m_ptr, l_ptr, h_ptr, pend_ptr, nw_ptr, n_src, src, q0, n_q, M,
    D: tl.constexpr, eps, norm_eps, PEND: tl.constexpr, PEND_FIRST: tl.constexpr, U_ALIGNED: tl.constexpr,
    KP: tl.constexpr, BLOCK_D: tl.constexpr, QMAX: tl.constexpr, NORM: tl.constexpr, QPAR: tl.constexpr,
):
    """``_phase1_kernel`` for few tokens (decode): a program holds all of a token's slots as one ``[KP, D]`` tile,
    so the slot loads are issued together and each query costs one reduction over D and one softmax over the
    slots. ``QPAR``: one program per (token, query) (grid ``[M, QMAX]``, programs past ``n_q`` do nothing), the
    queries on as many SMs; each program forms the pending sum itself and the query-0 program stores it, which is
    race-free only when no program reads the slot being written (``src`` differs from ``n_src - 1``, or nothing is
    read: no pending output, or ``PEND_FIRST``). Otherwise one program per token walks the queries, unrolled to
    ``QMAX`` (masked past ``n_q``) so that their loads are not a chain of round trips."""
    t = tl.program_id(0).to(tl.int64)
    qp = tl.program_id(1)
    if qp < n_q:
        offs_k = tl.arange(0, KP)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        if QPAR:  # the query's addresses first: their loads and the parameters' behind them overlap the slots'
            wp, gp = _query_ptrs(qtab, w0_ptr, g0_ptr, q0 + qp, Q, U_ALIGNED)
        nw = _load_gain(nw_ptr, offs_d, d_ok, NORM)
        slot = M.to(tl.int64) * D
        n_mem = n_src - 1 if PEND else n_src
        rows = offs_k.to(tl.int64)[:, None] * slot + t * D + offs_d[None, :]
        x = tl.load(v_ptr + rows, mask=(offs_k < n_mem)[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        if PEND:
            last = _absorb(v_ptr, pend_ptr, src.to(tl.int64) * slot, n_mem.to(tl.int64) * slot, t * D + offs_d, d_ok,
                           PEND_FIRST, qp == 0)
            x = tl.where((offs_k == n_mem)[:, None], last[None, :], x)
        valid = offs_k < n_src
        if QPAR:
            u = _load_u(wp, gp, qp, offs_d, d_ok, n_q)
            _rows_query(x, 0.0, valid, u, o_ptr, m_ptr, l_ptr, h_ptr, nw, qp, n_q, t, M, slot, offs_d, d_ok, D, eps,
                        norm_eps, NORM, True)
        else:
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)  # once for all the queries
            for q in tl.static_range(QMAX):
                wp, gp = _query_ptrs(qtab, w0_ptr, g0_ptr, q0 + q, Q, U_ALIGNED)
                u = _load_u(wp, gp, q, offs_d, d_ok, n_q)
                _rows_query(x, rstd, valid, u, o_ptr, m_ptr, l_ptr, h_ptr, nw, q, n_q, t, M, slot, offs_d, d_ok, D,
                            eps, norm_eps, NORM, False)


@triton.jit(do_not_specialize=["j", "k", "qi", "M"])
def _phase2_kernel(
    o_ptr, m_ptr, l_ptr, j, v_ptr, k, w_ptr, g_ptr, h_ptr, pend_ptr, nw_ptr, M, D: tl.constexpr, eps, norm_eps,
    PEND: tl.constexpr, PEND_FIRST: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, NORM: tl.constexpr,
):
    offs_t, offs_d, t_ok, d_ok, tile_ok, offs = _token_tile(tl.program_id(0), M, D, BLOCK_T, BLOCK_D)
    nw = _load_gain(nw_ptr, offs_d, d_ok, NORM)
    slot = M.to(tl.int64) * D
    o = tl.load(o_ptr + j * slot + offs, mask=tile_ok, other=0.0)
    m = tl.load(m_ptr + j * M + offs_t, mask=t_ok, other=0.0)
    l = tl.load(l_ptr + j * M + offs_t, mask=t_ok, other=1.0)
    if PEND:
        p = _absorb(v_ptr, pend_ptr, k * slot, k * slot, offs, tile_ok, PEND_FIRST, True)
    else:
        p = tl.load(v_ptr + k * slot + offs, mask=tile_ok, other=0.0).to(tl.float32)
    u = tl.load(w_ptr + offs_d, mask=d_ok, other=0.0).to(tl.float32) * \
        tl.load(g_ptr + offs_d, mask=d_ok, other=0.0).to(tl.float32)  # the one query's u = w * gain
    s = _score(p, u, D, eps)
    m_new = tl.maximum(m, s)
    a = tl.exp(m - m_new)
    b = tl.exp(s - m_new)
    h = (o * a[:, None] + p * b[:, None]) / (l * a + b)[:, None]
    _store_h(h_ptr, offs, tile_ok, h, nw, D, norm_eps, NORM)


class QueryTable:
    """Where the kernels read the queries ``u_q = w_q * gain_q`` from: the addresses of every query's pseudo-query
    ``w_q`` and key-norm gain (``D`` contiguous elements each, one dtype per kind) in one ``int64 [2, Q]`` device
    table (phase 1: a program picks its query's row), and the tensors themselves (phase 2 passes its one query's
    as pointer arguments, saving the table load on its critical path). The kernels form ``u`` from the live
    parameters, so a decode step spends no launches on it (it was five: two stacks, two casts and a product), a
    parameter updated in place is read as it is, and the table stays valid as long as the parameters keep their
    storage (as a CUDA graph's weights must; the table holds them). ``from_u`` wraps a computed fp32 ``u [Q, D]``
    (rows as ``w``, a gain of ones)."""

    __slots__ = ("aligned", "d", "gains", "num", "tab", "weights")

    def __init__(self, weights: list[torch.Tensor], gains: list[torch.Tensor]) -> None:
        d = weights[0].numel()
        for kind, ts in (("pseudo-query", weights), ("gain", gains)):
            if any(t.numel() != d or not t.is_contiguous() or t.dtype != ts[0].dtype or t.device != ts[0].device
                   for t in ts):
                raise ValueError(f"{_WHERE}: every {kind} must be a contiguous tensor of D={d} elements of one "
                                 f"dtype and device, got {[(t.dtype, tuple(t.shape)) for t in ts]}")
        ptrs = [t.data_ptr() for t in weights] + [t.data_ptr() for t in gains]
        self.tab = torch.tensor(ptrs, dtype=torch.int64).to(weights[0].device)
        self.weights, self.gains, self.num, self.d = list(weights), list(gains), len(weights), d  # kept alive
        self.aligned = all(p % 16 == 0 for p in ptrs)

    @classmethod
    def from_u(cls, u_QD: torch.Tensor) -> QueryTable:
        if u_QD.dtype != torch.float32 or u_QD.dim() != 2 or not u_QD.is_contiguous():
            raise ValueError(f"{_WHERE}: queries u must be a contiguous fp32 [Q, D], got {u_QD.dtype} "
                             f"{tuple(u_QD.shape)}")
        return cls(list(u_QD), [torch.ones(u_QD.shape[1], device=u_QD.device)] * u_QD.shape[0])

    def args(self) -> tuple:
        """The phase-1 kernels' table arguments (the first ``w`` and gain give the pointer types)."""
        return self.tab, self.weights[0], self.gains[0], self.num


def _queries(u: torch.Tensor | QueryTable) -> QueryTable:
    return u if isinstance(u, QueryTable) else QueryTable.from_u(u)


def _check(v_KMD: torch.Tensor, queries: QueryTable) -> None:
    if v_KMD.dim() != 3 or not v_KMD.is_contiguous():
        raise ValueError(f"{_WHERE}: the block-state buffer must be a contiguous [K, M, D], got "
                         f"{tuple(v_KMD.shape)} (contiguous={v_KMD.is_contiguous()})")
    if queries.d != v_KMD.shape[2]:
        raise ValueError(f"{_WHERE}: queries have D={queries.d}, the block states D={v_KMD.shape[2]}")


def _pending(v_KMD: torch.Tensor, pending: torch.Tensor | None) -> torch.Tensor:
    if pending is None:
        return v_KMD
    if pending.shape != v_KMD.shape[1:] or pending.dtype != v_KMD.dtype or not pending.is_contiguous():
        raise ValueError(f"{_WHERE}: pending must be a contiguous {v_KMD.dtype} {tuple(v_KMD.shape[1:])} like a "
                         f"buffer slot, got {pending.dtype} {tuple(pending.shape)}")
    return pending


def phase1_triton(v_KMD: torch.Tensor, n_src: int, u_QD: torch.Tensor | QueryTable, q0: int, n_q: int, eps: float,
                  pending: torch.Tensor | None = None, pending_first: bool = False, src_slot: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries ``u[q0 : q0 + n_q]`` against slots ``v[:n_src]`` -> fp32 ``o [n_q, M, D]``, ``m, l [n_q, M]``
    and the first query's mix ``h [M, D] = o[0] / l[0]`` in the buffer's dtype.

    ``pending [M, D]`` (the previous sublayer's output, not yet added) is first added to the running sum in slot
    ``src_slot`` (default ``n_src - 1``, in place; ``pending_first``: nothing to add it to) and the sum stored in
    slot ``n_src - 1``, as ``v[n_src - 1] = v[src_slot] + pending`` would."""
    queries = _queries(u_QD)
    _check(v_KMD, queries)
    src = n_src - 1 if src_slot is None else src_slot
    if not (1 <= n_src <= v_KMD.shape[0] and n_q >= 1 and 0 <= q0 and q0 + n_q <= queries.num
            and 0 <= src < v_KMD.shape[0]):
        raise ValueError(f"{_WHERE}: phase1 needs 1 <= n_src <= K={v_KMD.shape[0]}, queries inside "
                         f"Q={queries.num} and a slot src_slot < K, got n_src={n_src}, q0={q0}, n_q={n_q}, "
                         f"src_slot={src_slot}")
    run = TwoPhaseLauncher(v_KMD, queries, n_q)
    h = run.phase1(n_src, q0, n_q, eps, _pending(v_KMD, pending), pending_first, src_slot=src)
    return run.o, run.m, run.l, h


def phase2_triton(o: torch.Tensor, m: torch.Tensor, l: torch.Tensor, j: int, v_KMD: torch.Tensor, k: int,
                  u_QD: torch.Tensor | QueryTable, qi: int, eps: float, pending: torch.Tensor | None = None,
                  pending_first: bool = False) -> torch.Tensor:
    """Sublayer ``j >= 1`` of the block (query ``u[qi]``) merges its partial sum ``v[k]`` with phase 1's
    ``o[j], m[j], l[j]`` -> ``h [M, D]`` in the buffer's dtype; ``pending`` is first added into ``v[k]`` (see
    :func:`phase1_triton`)."""
    queries = _queries(u_QD)
    _check(v_KMD, queries)
    run = TwoPhaseLauncher(v_KMD, queries, 0)
    run.o, run.m, run.l = o, m, l
    return run.phase2(j, k, qi, eps, _pending(v_KMD, pending), pending_first)


class _Launch:
    """One kernel at a fixed grid and warp count whose compiled variants are called directly after the first launch
    (``kernels.fast_launch.CompiledLaunch``, ``KVL_FAST_LAUNCH=0`` for the JIT every time: 29.6 us of the JIT's host
    time a launch on the H100 machine, session 12, against 7.2 us for a ``torch.add``; in launch-bound decode most of
    the two-phase stream's cost). ``key`` must fix everything the JIT specialises on that can change between calls
    of one instance (pointer alignment, constexpr values; the kernels' ints are ``do_not_specialize``). ``values``:
    every parameter in signature order, constexprs included."""

    __slots__ = ("grid", "launch", "num_warps")

    def __init__(self, kernel, grid: tuple[int, ...], num_warps: int) -> None:
        self.launch, self.grid, self.num_warps = CompiledLaunch(kernel), grid, num_warps

    @property
    def runners(self) -> dict:
        return self.launch.runners

    def __call__(self, key: tuple, *values) -> None:
        self.launch(self.grid, key, *values, num_warps=self.num_warps)


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


class TwoPhaseLauncher:
    """Launches over one block-state buffer ``v [K, M, D]`` and queries (a :class:`QueryTable`, or ``u [Q, D]``
    fp32) with the least host work
    per call (decode is launch-bound): sizes, grid and the phase-1 outputs ``o [S, M, D]``, ``m, l [S, M]``
    (fp32, reused by every block) are set up once, and the compiled kernels are called directly after their first
    launch (:class:`_Launch`). Arguments are not checked here (:func:`phase1_triton` and :func:`phase2_triton`
    check them); ``pending`` must be contiguous, of ``M * D`` elements in ``v``'s dtype (any shape: only its
    address is used). ``out_shape``: the shape ``h`` is allocated in (``M * D`` elements, e.g. ``[B, T, D]``), so
    that callers need no view."""

    def __init__(self, v_KMD: torch.Tensor, queries: torch.Tensor | QueryTable, max_queries: int,
                 out_shape: tuple[int, ...] | None = None) -> None:
        self.v, self.queries = v_KMD, _queries(queries)
        self._q_args = self.queries.args()
        _, self.mm, self.d = v_KMD.shape
        self.out_shape = tuple(v_KMD.shape[1:]) if out_shape is None else tuple(out_shape)
        self.block_t, self.block_d = _blocks(self.d)
        self.grid = (triton.cdiv(self.mm, self.block_t),)
        self.slots_p2, self.max_queries = triton.next_power_of_2(v_KMD.shape[0]), max_queries
        self.rows = self.mm <= ROWS_MAX_TOKENS and self.slots_p2 * self.block_d <= ROWS_MAX_ELEMS
        self._phase1 = _Launch(_phase1_rows_kernel, (self.mm,), ROWS_NUM_WARPS) if self.rows \
            else _Launch(_phase1_kernel, self.grid, NUM_WARPS)
        self._phase1_par = _Launch(_phase1_rows_kernel, (self.mm, max(1, max_queries)), ROWS_NUM_WARPS) \
            if self.rows and ROWS_QUERY_PROGRAMS else None
        self.p2_block_t = PHASE2_DECODE_ROWS if self.rows and PHASE2_DECODE_ROWS else self.block_t
        self._phase2 = _Launch(_phase2_kernel, (triton.cdiv(self.mm, self.p2_block_t),), PHASE2_NUM_WARPS)
        if max_queries > 0:
            self.o = torch.empty(max_queries, self.mm, self.d, device=v_KMD.device, dtype=torch.float32)
            self.m, self.l = torch.empty(2, max_queries, self.mm, device=v_KMD.device, dtype=torch.float32)

    def _out(self, out: torch.Tensor | None) -> torch.Tensor:
        return torch.empty(self.out_shape, device=self.v.device, dtype=self.v.dtype) if out is None else out

    def phase1(self, n_src: int, q0: int, n_q: int, eps: float, pending: torch.Tensor | None,
               pending_first: bool, out: torch.Tensor | None = None, norm: tuple | None = None,
               src_slot: int | None = None) -> torch.Tensor:
        """``out``: where to write ``h`` (contiguous, ``out_shape``, ``v``'s dtype), else a new tensor. ``norm``:
        ``(gain [D], eps)`` of an RMSNorm to apply to ``h`` on the way out (what ``kernels.norm.rms_norm`` gives).
        ``src_slot``: the running sum ``pending`` completes (default ``n_src - 1``: in place); a separate slot lets
        the decode kernel run one program per query (:data:`ROWS_QUERY_PROGRAMS`)."""
        h = self._out(out)
        pend = self.v if pending is None else pending
        nw, norm_eps = (h, 0.0) if norm is None else norm
        src = n_src - 1 if src_slot is None else src_slot
        args = (self.v, *self._q_args, self.o, self.m, self.l, h, pend, nw, n_src, src, q0, n_q, self.mm, self.d,
                eps, norm_eps, pending is not None, pending_first, self.queries.aligned)
        key = (pending is not None, pending_first, _aligned(h), _aligned(pend), norm is not None, _aligned(nw),
               self.queries.aligned)
        if not self.rows:
            self._phase1(key, *args, self.block_t, self.block_d, norm is not None)
        elif self._phase1_par is not None and (pending is None or pending_first or src != n_src - 1):
            self._phase1_par(key, *args, self.slots_p2, self.block_d, self.max_queries, norm is not None, True)
        else:
            self._phase1(key, *args, self.slots_p2, self.block_d, self.max_queries, norm is not None, False)
        return h

    def phase2(self, j: int, k: int, qi: int, eps: float, pending: torch.Tensor | None,
               pending_first: bool, out: torch.Tensor | None = None, norm: tuple | None = None) -> torch.Tensor:
        h = self._out(out)
        pend = self.v if pending is None else pending
        nw, norm_eps = (h, 0.0) if norm is None else norm
        w, g = self.queries.weights[qi], self.queries.gains[qi]  # pointer arguments: no table load on the way
        self._phase2((pending is not None, pending_first, _aligned(h), _aligned(pend), norm is not None, _aligned(nw),
                      _aligned(w), _aligned(g)),
                     self.o, self.m, self.l, j, self.v, k, w, g, h, pend, nw, self.mm, self.d, eps, norm_eps,
                     pending is not None, pending_first, self.p2_block_t, self.block_d, norm is not None)
        return h
