"""KDA chunked backward, written out by hand (no autograd), in batched PyTorch: the reference for the Triton backward.

Implements the gradient of the chunk form of ``../shared/REFERENCE.md`` section 1 (the forward of
``chunk_triton.py``; contract ``/tmp/kda_contract.md`` between the forward and backward helpers), derived from
the equations. Per chunk of C = 64 rows (padded rows: g = q = k = v = beta = 0) and value head, with q, k already
normalised and g the log-decay:

    G = cumsum(g), Gl = G[-1], Akk = strict_lower(beta_i k_i.k_j e^{G_i-G_j}), T = (I + Akk)^-1,
    X = beta K e^G, Y = beta V, W = T X, U = T Y, Aqk = lower(scale q_i.k_j e^{G_i-G_j}),
    qg = scale Q e^G, kg = K e^{Gl-G}, Vnew = U - W S, O = qg S + Aqk Vnew, S' = e^{Gl} S + kg^T Vnew.

Backward with dO and the gradient dS of the final state:

1. reverse pass over chunks (sequential): dH[c] = dS (gradient of the state leaving chunk c);
   dVnew = Aqk^T dO + kg dS; dS <- e^{Gl} dS + qg^T dO - W^T dVnew; the last dS is dh0;
2. chunk-parallel: dqg = dO h^T, dkg = Vnew dH^T, dGl = e^{Gl} sum_v dH h, dAqk = lower(dO Vnew^T),
   dW = -dVnew h^T, dT = dVnew Y^T + dW X^T, dX = T^T dW, dY = T^T dVnew, dAkk = strict_lower(-T^T dT T^T);
3. pairwise scores ``A_ij = sum_d a_id k_jd e^{G_id - G_jd}``: ``da_i = sum_j dA_ij k_j e^{G_i-G_j}``,
   ``dk_j = sum_i dA_ij a_i e^{G_i-G_j}``, ``dG += a da - k dk`` (Aqk: a = scale q; Akk: a = beta k, so that
   dbeta needs no division), computed by 16-row sub-blocks with off-diagonal pairs factored through the first row
   of the query sub-block (every exponent <= 0) and diagonal sub-blocks pairwise with masked exponents;
4. gated tensors (qg, kg, X, Y) by the chain rule; dGl added to the chunk's last row; dg = reverse cumsum of dG.

Layout of per-chunk tensors: ``[NC, HV, C, X]`` over the chunk table of ``chunk_triton._tables`` (row r of
chunk c is token ``cbos[c] + r`` when ``r < clen[c]``); states ``[NC, HV, K, V]`` (entering each chunk).
Also here: :func:`chunk_kda_fwd_state_torch`, the PyTorch version of the forward intermediates
(``KDAFwdState``) the backward consumes. Compute dtype: fp64 for fp64 inputs, else fp32.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from kernels.host_ints import host_ints
from kernels.kda.chunk_torch import intra_chunk_scores

CHUNK = 64
SUB = 16


class KDAFwdState(NamedTuple):
    """Forward intermediates (contract field names). Per-chunk tensors ``[NC, HV, C, X]``; h ``[NC, HV, K, V]``."""

    o: torch.Tensor  # [B, T, HV, V]
    ht: torch.Tensor  # [N, HV, K, V]
    G: torch.Tensor  # [NC, HV, C, K] chunk-local cumulative log-decay
    Gl: torch.Tensor  # [NC, HV, K]
    Aqk: torch.Tensor  # [NC, HV, C, C] lower incl. diagonal
    T: torch.Tensor  # [NC, HV, C, C] (I + Akk)^-1, unit diagonal
    W: torch.Tensor  # [NC, HV, C, K]
    U: torch.Tensor  # [NC, HV, C, V]
    qg: torch.Tensor  # [NC, HV, C, K]
    kg: torch.Tensor  # [NC, HV, C, K]
    h: torch.Tensor  # [NC, HV, K, V] state entering each chunk
    vn: torch.Tensor  # [NC, HV, C, V]
    cbos: torch.Tensor  # [NC] int32 first token of each chunk
    clen: torch.Tensor  # [NC] int32 valid rows of each chunk
    s0: torch.Tensor  # [N] int32 first chunk of each sequence
    snc: torch.Tensor  # [N] int32 number of chunks of each sequence


class KDAGrads(NamedTuple):
    """Gradients of the core op (q, k normalised; g the log-decay), in the compute dtype."""

    dq: torch.Tensor  # [B, T, H, K]
    dk: torch.Tensor  # [B, T, H, K]
    dv: torch.Tensor  # [B, T, HV, V]
    dg: torch.Tensor  # [B, T, HV, K]
    dbeta: torch.Tensor  # [B, T, HV]
    dh0: torch.Tensor  # [N, HV, K, V]
    dA_log: torch.Tensor | None = None  # [HV] when the gate's backward ran inside (chunk_triton_bwd.BwdPrep)
    ddt_bias: torch.Tensor | None = None  # dt_bias's shape, likewise


def chunk_tables(T: int, B: int, cu_seqlens: torch.Tensor | None, device: torch.device):
    """(cbos, clen, s0, snc) int32: chunk table (token start, length), sequence table (first chunk, count).

    Cached per (sequence bounds, device): every KDA layer of a step asks for the same tables, and building them
    copies host lists to the device. A new entry goes up in one pinned, non-blocking copy, so it does not
    synchronise the host with the GPU (a blocking copy per call cost ~0.4 ms of idle GPU per forward on an H100).
    The tables are shared between calls: read-only."""
    if cu_seqlens is None:
        bounds = tuple((b * T, (b + 1) * T) for b in range(B))
    else:
        cs = host_ints(cu_seqlens)
        bounds = tuple(zip(cs[:-1], cs[1:]))
    return _chunk_tables(bounds, torch.device(device))


@functools.lru_cache(maxsize=64)
def _chunk_tables(bounds: tuple[tuple[int, int], ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    cbos, clen, s0, snc = [], [], [], []
    for bos, eos in bounds:
        s0.append(len(cbos))
        for t in range(bos, eos, CHUNK):
            cbos.append(t)
            clen.append(min(CHUNK, eos - t))
        snc.append(len(cbos) - s0[-1])
    # one buffer, each table starting at a multiple of 4 entries (16 bytes): Triton specialises kernels on pointer
    # alignment, so unaligned views would compile extra variants whenever the number of chunks changes
    tables = (cbos, clen, s0, snc)
    padded = [x + [0] * (-len(x) % 4) for x in tables]
    with torch.inference_mode(False):  # cached tensors may later be saved for a backward
        flat = torch.tensor([v for x in padded for v in x], dtype=torch.int32)
        if device.type == "cuda":
            flat = flat.pin_memory().to(device, non_blocking=True)
        else:
            flat = flat.to(device)
        parts = torch.split(flat, [len(x) for x in padded])
        return tuple(part[: len(x)] for part, x in zip(parts, tables))


def _rows(cbos: torch.Tensor, clen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat token index [NC, C] (clamped on padded rows) and the valid-row mask [NC, C]."""
    r = torch.arange(CHUNK, device=cbos.device)
    valid = r[None, :] < clen.long()[:, None]
    tok = torch.where(valid, cbos.long()[:, None] + r[None, :], torch.zeros_like(r)[None, :])
    return tok, valid


def to_chunks(x: torch.Tensor, cbos: torch.Tensor, clen: torch.Tensor, HV: int) -> torch.Tensor:
    """[B, T, Hx, X] (or [B, T, Hx]) -> [NC, HV, C, X] zero-padded, heads repeated to HV (grouped heads)."""
    squeeze = x.dim() == 3
    if squeeze:
        x = x[..., None]
    B, T, Hx, X = x.shape
    tok, valid = _rows(cbos, clen)
    y = x.reshape(B * T, Hx, X)[tok.reshape(-1)].view(-1, CHUNK, Hx, X)
    y = torch.where(valid[:, :, None, None], y, torch.zeros_like(y)).transpose(1, 2)
    if Hx != HV:
        y = y.repeat_interleave(HV // Hx, dim=1)
    return y.contiguous()


def from_chunks(y: torch.Tensor, cbos: torch.Tensor, clen: torch.Tensor, B: int, T: int, Hx: int) -> torch.Tensor:
    """[NC, HV, C, X] -> [B, T, Hx, X], summing the HV // Hx value heads of each q/k head (valid rows only)."""
    NC, HV, C, X = y.shape
    if Hx != HV:
        y = y.view(NC, Hx, HV // Hx, C, X).sum(2)
    tok, valid = _rows(cbos, clen)
    out = y.new_zeros(B * T, Hx, X)
    out[tok[valid]] = y.transpose(1, 2)[valid]
    return out.view(B, T, Hx, X)


def _suffix(g_c: torch.Tensor) -> torch.Tensor:
    """E_i = sum_{t > i} g_t = Gl - G_i, as suffix sums (accurate to its own size) [.., C, K]."""
    return torch.flip(torch.cumsum(torch.flip(g_c, [-2]), -2), [-2]) - g_c


def chunk_kda_fwd_state_torch(q, k, v, g, beta, scale, initial_state, cu_seqlens) -> KDAFwdState:
    """The forward and its intermediates in PyTorch (reference of ``chunk_kda_fwd_intermediates``).

    q, k ``[B, T, H, K]`` (normalised); v ``[B, T, HV, V]``; g ``[B, T, HV, K]`` log-decay; beta ``[B, T, HV]``;
    initial_state ``[N, HV, K, V]`` or None. Everything in the compute dtype (fp64 for fp64 q, else fp32).
    """
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    cbos, clen, s0, snc = chunk_tables(T, B, cu_seqlens, q.device)
    q_c, k_c, v_c, g_c = (to_chunks(x.to(cdt), cbos, clen, HV) for x in (q, k, v, g))
    b_c = to_chunks(beta.to(cdt), cbos, clen, HV)  # [NC, HV, C, 1]
    NC = q_c.shape[0]
    G = torch.cumsum(g_c, -2)
    cat = lambda x, y: torch.cat([x, y], 1)[:, :, None]  # noqa: E731  [NC, 2 HV, 1, C, K]
    A = intra_chunk_scores(cat(k_c, q_c), cat(k_c, k_c), cat(G, G))[:, :, 0]  # [NC, 2 HV, C, C]
    strict = torch.tril(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device), -1)
    Akk = torch.where(strict, b_c * A[:, :HV], torch.zeros_like(A[:, :HV]))
    Aqk = scale * A[:, HV:]
    eye = torch.eye(CHUNK, dtype=cdt, device=q.device)
    Tm = torch.linalg.solve_triangular(eye + Akk, eye.expand_as(Akk), upper=False, unitriangular=True)
    W = Tm @ (b_c * k_c * torch.exp(G))
    U = Tm @ (b_c * v_c)
    qg = scale * q_c * torch.exp(G)
    kg = k_c * torch.exp(_suffix(g_c))
    Gl = G[:, :, -1]
    h = q_c.new_zeros(NC, HV, K, V)
    vn = torch.zeros_like(U)
    N = s0.numel()
    S = q_c.new_zeros(N, HV, K, V) if initial_state is None else initial_state.to(cdt).clone()
    for j in range(int(snc.max()) if N else 0):
        act = torch.nonzero(snc > j).flatten()
        c = (s0[act] + j).long()
        Sa = S[act]
        h[c] = Sa
        vn[c] = U[c] - W[c] @ Sa
        S[act] = torch.exp(Gl[c])[..., None] * Sa + kg[c].transpose(-1, -2) @ vn[c]
    o_c = qg @ h + Aqk @ vn
    o = from_chunks(o_c, cbos, clen, B, T, HV)
    return KDAFwdState(o, S, G, Gl, Aqk, Tm, W, U, qg, kg, h, vn, cbos, clen, s0, snc)


def bwd_state_pass_torch(st: KDAFwdState, do_c: torch.Tensor, dht: torch.Tensor | None):
    """Reverse pass: (dVnew [NC,HV,C,V], dH [NC,HV,K,V] = grad of the state leaving each chunk, dh0 [N,HV,K,V]).

    do_c ``[NC, HV, C, V]`` in the compute dtype; dht ``[N, HV, K, V]`` or None.
    """
    cdt = do_c.dtype
    NC, HV, K, V = st.h.shape
    N = st.s0.numel()
    dS = do_c.new_zeros(N, HV, K, V) if dht is None else dht.to(cdt).clone()
    dH = do_c.new_zeros(NC, HV, K, V)
    dvn = torch.zeros_like(do_c)
    Aqk, kg, qg, W, Gl = (x.to(cdt) for x in (st.Aqk, st.kg, st.qg, st.W, st.Gl))
    for j in range(int(st.snc.max()) if N else 0):
        act = torch.nonzero(st.snc > j).flatten()
        c = (st.s0[act] + st.snc[act] - 1 - j).long()
        dSa = dS[act]
        dH[c] = dSa
        dv = Aqk[c].transpose(-1, -2) @ do_c[c] + kg[c] @ dSa
        dvn[c] = dv
        dS[act] = torch.exp(Gl[c])[..., None] * dSa + qg[c].transpose(-1, -2) @ do_c[c] - W[c].transpose(-1, -2) @ dv
    return dvn, dH, dS


def pair_grads(dA: torch.Tensor, a: torch.Tensor, k: torch.Tensor, G: torch.Tensor):
    """Gradients of ``A_ij = sum_d a_id k_jd e^{G_id - G_jd}`` (j <= i; dA already zero elsewhere).

    dA ``[.., C, C]``; a, k, G ``[.., C, K]``. Returns (da, dk) ``[.., C, K]``; the G gradient is ``a da - k dk``.
    Sub-blocks of 16: off-diagonal pairs J < I through the first row of block I, diagonal blocks pairwise.
    """
    nb = CHUNK // SUB
    lead = a.shape[:-2]
    K = a.shape[-1]
    a6, k6, G6 = (x.reshape(*lead, nb, SUB, K) for x in (a, k, G))
    dA6 = dA.reshape(*lead, nb, SUB, nb, SUB)
    da = torch.zeros_like(a6)
    dk = torch.zeros_like(k6)
    for i_blk in range(1, nb):
        ref = G6[..., i_blk, :1, :]  # [.., 1, K]
        e_i = torch.exp(G6[..., i_blk, :, :] - ref)
        a_dec = a6[..., i_blk, :, :] * e_i
        acc = torch.zeros_like(a_dec)
        for j_blk in range(i_blk):
            e_j = torch.exp(ref - G6[..., j_blk, :, :])
            d = dA6[..., i_blk, :, j_blk, :]  # [.., 16, 16]
            acc = acc + d @ (k6[..., j_blk, :, :] * e_j)
            dk[..., j_blk, :, :] += e_j * (d.transpose(-1, -2) @ a_dec)
        da[..., i_blk, :, :] += e_i * acc
    r = torch.arange(SUB, device=a.device)
    dAd = torch.stack([dA6[..., b, :, b, :] for b in range(nb)], -3)  # [.., nb, 16, 16]
    for j in range(SUB):
        expo = torch.where((r >= j)[:, None], G6 - G6[..., j : j + 1, :], torch.zeros_like(G6))
        e = torch.exp(expo)  # [.., nb, 16(i), K]
        col = dAd[..., :, j : j + 1]  # [.., nb, 16(i), 1]
        da += col * k6[..., j : j + 1, :] * e
        dk[..., j, :] += (col * a6 * e).sum(-2)
    return da.reshape(a.shape), dk.reshape(k.shape)


def bwd_dv_torch(st: KDAFwdState, v_c, b_c, do_c, dvn, dH):
    """Reductions over V (step 2 of the module docstring, all but the ``dW X^T`` part of dT).

    v_c, do_c, dvn ``[NC, HV, C, V]``; b_c ``[NC, HV, C, 1]``; dH ``[NC, HV, K, V]``, in the compute dtype.
    Returns dqg, dkg, dW ``[NC, HV, C, K]``, dGl ``[NC, HV, K]``, dAqk, dT ``[NC, HV, C, C]``, dv ``[NC, HV, C, V]``,
    dbeta ``[NC, HV, C, 1]`` (its V part).
    """
    cdt = do_c.dtype
    h, vn, Tm, Gl = st.h.to(cdt), st.vn.to(cdt), st.T.to(cdt), st.Gl.to(cdt)
    ht = h.transpose(-1, -2)
    lower = torch.tril(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=do_c.device))
    dqg = do_c @ ht
    dkg = vn @ dH.transpose(-1, -2)
    dW = -(dvn @ ht)
    dGl = torch.exp(Gl) * (dH * h).sum(-1)
    dAqk = torch.where(lower, do_c @ vn.transpose(-1, -2), torch.zeros((), dtype=cdt, device=do_c.device))
    dT = dvn @ (b_c * v_c).transpose(-1, -2)
    dY = Tm.transpose(-1, -2) @ dvn
    return dqg, dkg, dW, dGl, dAqk, dT, b_c * dY, (v_c * dY).sum(-1, keepdim=True)


def pairwise_torch(dAqk, dAkk, q_c, k_c, G, b_c, scale: float):
    """Pairwise part for Aqk (a = scale q) and Akk (a = beta k): (dq, dk, dG [NC, HV, C, K], dbeta [NC, HV, C, 1])."""
    da_q, dk_q = pair_grads(dAqk, scale * q_c, k_c, G)
    a_k = b_c * k_c
    da_k, dk_k = pair_grads(dAkk, a_k, k_c, G)
    dG = scale * q_c * da_q - k_c * dk_q + a_k * da_k - k_c * dk_k
    return scale * da_q, dk_q + dk_k + b_c * da_k, dG, (k_c * da_k).sum(-1, keepdim=True)


def bwd_pairwise_gated_torch(Tm, q_c, k_c, g_c, b_c, dqg, dkg, dW, dGl, dAqk, dT, scale: float):
    """Steps 2 (rest) to 4: dT += dW X^T, dX = T^T dW, dAkk, the pairwise decay gradients, the gated tensors and
    the reverse cumulative sum. Tm ``[NC, HV, C, C]``; q_c, k_c, g_c ``[NC, HV, C, K]``; b_c ``[NC, HV, C, 1]``;
    the rest from :func:`bwd_dv_torch`. Returns dq, dk, dg ``[NC, HV, C, K]`` and dbeta ``[NC, HV, C, 1]`` (K part).
    """
    cdt = q_c.dtype
    Tm = Tm.to(cdt)
    G = torch.cumsum(g_c, -2)
    eG = torch.exp(G)
    eE = torch.exp(_suffix(g_c))
    X = b_c * k_c * eG
    dT = dT + dW @ X.transpose(-1, -2)
    Tt = Tm.transpose(-1, -2)
    dX = Tt @ dW
    strict = torch.tril(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q_c.device), -1)
    dAkk = torch.where(strict, -(Tt @ dT @ Tt), torch.zeros((), dtype=cdt, device=q_c.device))
    dq, dk, dG, db = pairwise_torch(dAqk, dAkk, q_c, k_c, G, b_c, scale)
    # gated tensors: qg = scale q e^G, kg = k e^{Gl - G}, X = beta k e^G
    qg = scale * q_c * eG
    dq = dq + scale * eG * dqg
    dG = dG + qg * dqg
    kg = k_c * eE
    dk = dk + eE * dkg
    dG = dG - kg * dkg
    dGl = dGl + (kg * dkg).sum(-2)
    dk = dk + b_c * eG * dX
    db = db + (k_c * eG * dX).sum(-1, keepdim=True)
    dG = dG + X * dX
    dG[:, :, -1] += dGl
    dg = torch.flip(torch.cumsum(torch.flip(dG, [-2]), -2), [-2])
    return dq, dk, dg, db


def bwd_chunk_local_torch(st: KDAFwdState, q_c, k_c, v_c, g_c, b_c, do_c, dvn, dH, scale: float):
    """Chunk-parallel part (steps 2-4), per-chunk layout in the compute dtype: dq, dk, dv, dg, dbeta [NC, HV, C, *]."""
    dqg, dkg, dW, dGl, dAqk, dT, dv, db_v = bwd_dv_torch(st, v_c, b_c, do_c, dvn, dH)
    dq, dk, dg, db = bwd_pairwise_gated_torch(st.T, q_c, k_c, g_c, b_c, dqg, dkg, dW, dGl, dAqk, dT, scale)
    return dq, dk, dv, dg, db + db_v


def chunk_kda_bwd_torch(q, k, v, g, beta, scale, st: KDAFwdState, do, dht) -> KDAGrads:
    """Manual backward of the core op from its forward intermediates ``st``; shapes as the forward's inputs.

    do ``[B, T, HV, V]``; dht ``[N, HV, K, V]`` or None. Returns :class:`KDAGrads` in the compute dtype.
    """
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, T, H, K = q.shape
    HV = v.shape[2]
    cb, cl = st.cbos, st.clen
    q_c, k_c, v_c, g_c, do_c = (to_chunks(x.to(cdt), cb, cl, HV) for x in (q, k, v, g, do))
    b_c = to_chunks(beta.to(cdt), cb, cl, HV)
    dvn, dH, dh0 = bwd_state_pass_torch(st, do_c, dht)
    dq, dk, dv, dg, db = bwd_chunk_local_torch(st, q_c, k_c, v_c, g_c, b_c, do_c, dvn, dH, scale)
    return KDAGrads(
        from_chunks(dq, cb, cl, B, T, H),
        from_chunks(dk, cb, cl, B, T, H),
        from_chunks(dv, cb, cl, B, T, HV),
        from_chunks(dg, cb, cl, B, T, HV),
        from_chunks(db, cb, cl, B, T, HV)[..., 0],
        dh0,
    )
