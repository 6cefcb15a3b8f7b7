"""Pure-PyTorch chunked KDA (the CPU path of ``chunk_kda``), vectorised over batch, heads and chunks.

Implements the chunk form of ``../shared/REFERENCE.md`` section 1 with its numerical rules:
chunk-local fp32 cumulative gates; pairwise decays factored through a reference row (the first row of
the query sub-block) for sub-block pairs ``J < I``, so both factors are ``exp(<= 0)``; diagonal 16 x 16
sub-blocks computed pairwise, one key column at a time, masking with ``where`` before ``exp``; a
unit-lower-triangular solve for ``(I + Akk)^-1``; a sequential state pass across chunks only.
Backward is autograd through these ops (exact, and NaN-free because every masked exponent is 0).

Shapes (after head expansion and transposition): ``x_BHTK``; chunked ``x_BHNCK`` with N chunks of C.
Varlen input is handled by the caller (``pack_varlen`` below pads each sequence at its end with
identity steps: g = 0, beta = 0, k = 0, which leave outputs and the final state unchanged).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUB = 16


def _pad_time(x: torch.Tensor, T_pad: int) -> torch.Tensor:
    """Zero-pad dim 2 (time, in [B, H, T, ...]) to T_pad."""
    T = x.shape[2]
    if T == T_pad:
        return x
    pad = [0, 0] * (x.dim() - 3) + [0, T_pad - T]
    return F.pad(x, pad)


def _diag_blocks(a_BHNIsK: torch.Tensor, k_BHNIsK: torch.Tensor, G_BHNIsK: torch.Tensor) -> torch.Tensor:
    """Inside each 16-row sub-block: out[i, j] = sum_d a_i[d] k_j[d] exp(G_i[d] - G_j[d]) for j <= i, else 0.

    All pairs at once: the exponent is masked to 0 above the diagonal *before* the exp (so no inf ever
    appears, forward or backward), and G_i - G_j <= 0 below it.
    """
    s = a_BHNIsK.shape[-2]
    causal = torch.tril(torch.ones(s, s, dtype=torch.bool, device=a_BHNIsK.device))
    diff = G_BHNIsK[..., :, None, :] - G_BHNIsK[..., None, :, :]  # [..., s(i), s(j), K]
    decay = torch.exp(torch.where(causal[:, :, None], diff, torch.zeros_like(diff)))
    out = torch.einsum("...id,...jd,...ijd->...ij", a_BHNIsK, k_BHNIsK, decay)
    return torch.where(causal, out, torch.zeros_like(out))  # [..., nb, s(i), s(j)]


def intra_chunk_scores(a: torch.Tensor, k: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """a, k, G ``[B, H, N, C, K]`` -> ``[B, H, N, C, C]`` with out[i, j] = sum_d a_i k_j exp(G_i - G_j), j <= i."""
    B, H, N, C, K = a.shape
    nb = C // SUB
    a6, k6, G6 = (x.reshape(B, H, N, nb, SUB, K) for x in (a, k, G))
    diag = _diag_blocks(a6, k6, G6)  # [B, H, N, nb, s, s]
    ref = G6[..., :, :1, :]  # first row of each query sub-block [B, H, N, nb, 1, K]
    a_dec = a6 * torch.exp(G6 - ref)
    lower = torch.tril(torch.ones(nb, nb, dtype=torch.bool, device=a.device), -1)  # J < I
    expo = ref[..., :, None, :, :] - G6[..., None, :, :, :]  # [B, H, N, I, J, s, K]
    expo = torch.where(lower[:, :, None, None], expo, torch.zeros_like(expo))
    k_dec = k6[..., None, :, :, :] * torch.exp(expo)
    off = torch.einsum("bhnisd,bhnijtd->bhnijst", a_dec, k_dec)
    off = torch.where(lower[:, :, None, None], off, torch.zeros_like(off))
    eye = torch.eye(nb, dtype=torch.bool, device=a.device)
    full = torch.where(eye[:, :, None, None], diag[..., :, None, :, :], off)  # [B, H, N, I, J, s, t]
    return full.permute(0, 1, 2, 3, 5, 4, 6).reshape(B, H, N, C, C)


def chunk_kda_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    chunk_size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense chunked KDA. q, k, g ``[B, T, HV, K]`` (heads already expanded, already normalised/gated);
    ``chunk_size`` 16 (one sub-block per chunk: pairwise decays only, the fastest choice on a CPU, measured
    ~2x faster than 64 at B4 T512 H4 K32) or a multiple of 16 (the GPU kernels' sub-blocked form);
    v ``[B, T, HV, V]``; beta ``[B, T, HV]``; initial_state ``[B, HV, K, V]`` or None.
    Returns o ``[B, T, HV, V]`` and the final state ``[B, HV, K, V]``, both in the compute dtype
    (fp64 if q is fp64, else fp32)."""
    if chunk_size % SUB:
        raise ValueError(f"chunk_kda_torch: chunk_size must be a multiple of {SUB}, got {chunk_size}")
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, T, HV, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    NC = max(1, -(-T // C))
    Tp = NC * C
    q_, k_, v_, g_ = (_pad_time(x.to(cdt).transpose(1, 2), Tp) for x in (q, k, v, g))
    b_ = _pad_time(beta.to(cdt).transpose(1, 2)[..., None], Tp)  # [B, HV, Tp, 1]
    q_, k_, v_, g_, b_ = (x.reshape(B, HV, NC, C, x.shape[-1]) for x in (q_, k_, v_, g_, b_))
    G = torch.cumsum(g_, dim=-2)  # chunk-local, fp32/fp64
    A = intra_chunk_scores(torch.cat([k_, q_], 1), torch.cat([k_, k_], 1), torch.cat([G, G], 1))
    strict = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device), -1)
    Akk = torch.where(strict, b_ * A[:, :HV], torch.zeros_like(A[:, :HV]))
    Aqk = scale * A[:, HV:]
    Gamma = torch.exp(G)
    rhs = torch.cat([b_ * k_ * Gamma, b_ * v_], dim=-1)
    eye = torch.eye(C, dtype=cdt, device=q.device)
    WU = torch.linalg.solve_triangular(eye + Akk, rhs, upper=False, unitriangular=True)
    W, U = WU[..., :K], WU[..., K:]
    q_dec = scale * q_ * Gamma
    G_last = G[..., -1:, :]  # [B, HV, NC, 1, K]
    k_tail = k_ * torch.exp(G_last - G)
    S = torch.zeros(B, HV, K, V, dtype=cdt, device=q.device) if initial_state is None else initial_state.to(cdt)
    outs = []
    for n in range(NC):
        v_new = U[:, :, n] - W[:, :, n] @ S
        outs.append(q_dec[:, :, n] @ S + Aqk[:, :, n] @ v_new)
        S = torch.exp(G_last[:, :, n]).transpose(-1, -2) * S + k_tail[:, :, n].transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).reshape(B, HV, Tp, V)[:, :, :T].transpose(1, 2)
    return o, S


def pack_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, T, ...] -> ([N, Lmax, ...] zero-padded at each sequence's end, flat index [T] into N * Lmax)."""
    cs = cu_seqlens.to(torch.long)
    lens = cs[1:] - cs[:-1]
    N, L = lens.numel(), max(int(lens.max()), 1) if lens.numel() else 1
    T = x.shape[1]
    seq = torch.repeat_interleave(torch.arange(N, device=x.device), lens.to(x.device), output_size=T)
    pos = torch.arange(T, device=x.device) - cs.to(x.device)[seq]
    flat = seq * L + pos
    out = x.new_zeros((N * L,) + tuple(x.shape[2:]))
    out = out.index_copy(0, flat, x[0])
    return out.view((N, L) + tuple(x.shape[2:])), flat


def unpack_varlen(y: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """[N, Lmax, ...] -> [1, T, ...] (inverse of pack_varlen)."""
    return y.reshape((-1,) + tuple(y.shape[2:])).index_select(0, flat)[None]


def recurrent_kda_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token loop vectorised over batch and heads. Same shapes as :func:`chunk_kda_torch` (heads expanded)."""
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, T, HV, K = q.shape
    V = v.shape[-1]
    q, k, v, g, beta = (x.to(cdt) for x in (q, k, v, g, beta))
    S = torch.zeros(B, HV, K, V, dtype=cdt, device=q.device) if initial_state is None else initial_state.to(cdt)
    outs = []
    for t in range(T):
        S = S * torch.exp(g[:, t])[..., None]
        u = v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        S = S + (beta[:, t, :, None] * k[:, t])[..., None] * u[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, scale * q[:, t]))
    o = torch.stack(outs, dim=1) if outs else v.new_zeros(B, 0, HV, V)
    return o, S
