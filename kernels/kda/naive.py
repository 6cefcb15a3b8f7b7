"""Readable references for Kimi Delta Attention (KDA): the specification the fast paths are tested against.

Implements ``../shared/REFERENCE.md`` section 1 (Kimi Linear, arXiv 2510.26692, and the public
flash-linear-attention API it was released with), written from the equations, not copied:

- :func:`kda_gate_ref`: the "unbounded" softplus gate and the sigmoid lower-bound gate;
- :func:`l2norm_ref`: ``x / sqrt(sum(x^2) + eps)`` over the head dim (what the KDA layer applies to q, k);
- :func:`naive_recurrent_kda`: the token-loop recurrence (the oracle; call it on fp64 tensors);
- :func:`naive_chunk_kda`: the chunk form, one chunk and one head at a time, pairwise decays taken
  directly as ``exp(G_i - G_j)`` (always <= 1 on the causal side), unit-lower-triangular solve.

Shapes: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g ``[B, T, HV, K]`` (log-decay <= 0); beta
``[B, T, HV]``; states ``[N, HV, K, V]``. HV is a multiple of H: value head ``hv`` reads q/k head
``hv // (HV // H)``. Varlen: B = 1 and ``cu_seqlens [N + 1]``. These functions compute in the dtype
they are given (fp64 for the oracle) and do not validate their input (the public wrappers in
``kernels/kda/__init__.py`` do).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """L2-normalise over the last dim: ``x / sqrt(sum(x^2) + eps)`` (fla's and transformers' convention)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def kda_gate_ref(
    g_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None = None, lower_bound: float | None = None
) -> torch.Tensor:
    """Per-channel log-decay from the raw gate pre-activation.

    g_raw ``[B, T, HV, K]``; A_log ``[HV]``; dt_bias ``[HV * K]`` or None. Computes in fp32 (or fp64 if given).
    - unbounded (``lower_bound is None``): ``g = -exp(A_log[h]) * softplus(g_raw + dt_bias)``, softplus = identity
      above 20;
    - lower bound: ``g = lower_bound * sigmoid(exp(A_log[h]) * (g_raw + dt_bias))``, ``lower_bound`` in [-5, 0).
    """
    dtype = torch.float64 if g_raw.dtype == torch.float64 else torch.float32
    HV, K = g_raw.shape[-2], g_raw.shape[-1]
    x = g_raw.to(dtype)
    if dt_bias is not None:
        x = x + dt_bias.to(dtype).view(HV, K)
    a = A_log.to(dtype).view(HV, 1)
    if lower_bound is None:
        return -torch.exp(a) * F.softplus(x, beta=1.0, threshold=20.0)
    return lower_bound * torch.sigmoid(torch.exp(a) * x)


def _expand_heads(x: torch.Tensor, HV: int) -> torch.Tensor:
    """[B, T, H, K] -> [B, T, HV, K] by repeating each q/k head HV // H times (grouped value heads)."""
    H = x.shape[2]
    return x if H == HV else x.repeat_interleave(HV // H, dim=2)


def _segments(T: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, T)]
    cs = [int(c) for c in cu_seqlens.tolist()]
    return list(zip(cs[:-1], cs[1:]))


def naive_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-loop KDA: decay rows, delta-rule update on the decayed state, read out. Returns (o, final_state).

    o ``[B, T, HV, V]`` and the state are computed in the dtype of q (use fp64 for the oracle).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K**-0.5 if scale is None else scale
    dt = q.dtype
    qe, ke = _expand_heads(q, HV).to(dt), _expand_heads(k, HV).to(dt)
    v, g, beta = v.to(dt), g.to(dt), beta.to(dt)
    o = torch.zeros(B, T, HV, V, dtype=dt, device=q.device)
    segs = _segments(T, cu_seqlens)
    finals = []
    for b in range(B):
        for n, (bos, eos) in enumerate(segs):
            idx = n if cu_seqlens is not None else b
            S = torch.zeros(HV, K, V, dtype=dt, device=q.device)  # [HV, K, V]
            if initial_state is not None:
                S = initial_state[idx].to(dt)
            for t in range(bos, eos):
                S = S * torch.exp(g[b, t])[:, :, None]
                u = v[b, t] - torch.einsum("hkv,hk->hv", S, ke[b, t])
                S = S + beta[b, t][:, None, None] * ke[b, t][:, :, None] * u[:, None, :]
                o[b, t] = torch.einsum("hkv,hk->hv", S, scale * qe[b, t])
            finals.append(S)
    final = torch.stack(finals) if output_final_state else None
    return o, final


def _chunk_one_head(q, k, v, g, beta, S, scale, C):
    """One sequence, one head: q, k, g [L, K]; v [L, V]; beta [L]; S [K, V]. Returns (o [L, V], S)."""
    L = q.shape[0]
    o = torch.empty(L, v.shape[1], dtype=q.dtype, device=q.device)
    for s in range(0, L, C):
        e = min(s + C, L)
        qc, kc, vc, bc = q[s:e], k[s:e], v[s:e], beta[s:e]
        G = torch.cumsum(g[s:e], 0)  # chunk-local cumulative log-decay [c, K]
        n = e - s
        diff = G[:, None, :] - G[None, :, :]  # [i, j, K] = G_i - G_j
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device))
        decay = torch.exp(torch.where(causal[:, :, None], diff, torch.zeros_like(diff)))
        Akk = bc[:, None] * torch.einsum("id,jd,ijd->ij", kc, kc, decay)
        Akk = torch.where(torch.tril(causal, -1), Akk, torch.zeros_like(Akk))
        Aqk = scale * torch.einsum("id,jd,ijd->ij", qc, kc, decay)
        Aqk = torch.where(causal, Aqk, torch.zeros_like(Aqk))
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        Gamma = torch.exp(G)
        W = torch.linalg.solve_triangular(eye + Akk, bc[:, None] * kc * Gamma, upper=False, unitriangular=True)
        U = torch.linalg.solve_triangular(eye + Akk, bc[:, None] * vc, upper=False, unitriangular=True)
        Vnew = U - W @ S
        o[s:e] = (scale * qc * Gamma) @ S + Aqk @ Vnew
        S = torch.exp(G[-1])[:, None] * S + (kc * torch.exp(G[-1:] - G)).T @ Vnew
    return o, S


def naive_chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunk-form KDA, one head and one chunk at a time (readable, slow). Same contract as the recurrence."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K**-0.5 if scale is None else scale
    dt = q.dtype
    qe, ke = _expand_heads(q, HV), _expand_heads(k, HV)
    v, g, beta = v.to(dt), g.to(dt), beta.to(dt)
    o = torch.zeros(B, T, HV, V, dtype=dt, device=q.device)
    finals = []
    for b in range(B):
        for n, (bos, eos) in enumerate(_segments(T, cu_seqlens)):
            idx = n if cu_seqlens is not None else b
            states = []
            for h in range(HV):
                S = torch.zeros(K, V, dtype=dt, device=q.device)
                if initial_state is not None:
                    S = initial_state[idx, h].to(dt)
                sl = slice(bos, eos)
                o_h, S = _chunk_one_head(
                    qe[b, sl, h], ke[b, sl, h], v[b, sl, h], g[b, sl, h], beta[b, sl, h], S, scale, chunk_size
                )
                o[b, sl, h] = o_h
                states.append(S)
            finals.append(torch.stack(states))
    return o, (torch.stack(finals) if output_final_state else None)
