"""Chunked PyTorch per-head max logit: the CPU path and the reference for the Triton pass.

Same contract as :func:`kernels.qk_max.naive.max_logits_per_head_naive`, but it never holds more than
``chunk`` query rows of logits at a time (``[H, chunk, S_visible]``), and with ``cu_seqlens`` it only
looks at each segment's own block, so the whole ``T x S`` matrix is never materialised.
Maths in fp32 (inputs are upcast per chunk).
"""

from __future__ import annotations

import torch

# elements of one logit chunk [H, rows, keys]: 16M fp32 = 64 MiB
_CHUNK_ELEMS = 1 << 24


def _block_max(
    q_THD: torch.Tensor, k_SHD: torch.Tensor, scale: float, causal: bool, kmask_S: torch.Tensor | None,
) -> torch.Tensor:
    """Max over one (query block, key block) pair with bottom-right causal alignment; returns fp32 [H]."""
    T, H, _ = q_THD.shape
    S = k_SHD.shape[0]
    out_H = torch.full((H,), float("-inf"), dtype=torch.float32, device=q_THD.device)
    if T == 0 or S == 0:
        return out_H
    rows = max(1, _CHUNK_ELEMS // max(1, H * S))
    k_HDS = k_SHD.float().permute(1, 2, 0)
    for t0 in range(0, T, rows):
        t1 = min(T, t0 + rows)
        # keys beyond the last row's causal horizon are invisible to the whole chunk: skip them
        s_end = min(S, t1 + (S - T)) if causal else S
        if s_end <= 0:
            continue
        q_HcD = q_THD[t0:t1].float().transpose(0, 1)
        logits_HcS = torch.bmm(q_HcD, k_HDS[:, :, :s_end]) * scale
        vis_cS = torch.ones(t1 - t0, s_end, dtype=torch.bool, device=q_THD.device)
        if causal:
            i = torch.arange(t0, t1, device=q_THD.device)[:, None]
            j = torch.arange(s_end, device=q_THD.device)[None, :]
            vis_cS &= j <= i + (S - T)
        if kmask_S is not None:
            vis_cS &= kmask_S[None, :s_end]
        logits_HcS = logits_HcS.masked_fill(~vis_cS[None], float("-inf"))
        out_H = torch.maximum(out_H, logits_HcS.amax(dim=(1, 2)))
    return out_H


def max_logits_per_head_chunked(
    q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool,
    cu_seqlens: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-head max of ``scale * q_i . k_j`` over visible pairs; fp32 ``[H]`` (-inf for a head with no pair)."""
    B, T, H, _ = q.shape
    out_H = torch.full((H,), float("-inf"), dtype=torch.float32, device=q.device)
    kmask_BS = key_padding_mask.to(q.device).bool() if key_padding_mask is not None else None
    if cu_seqlens is None:
        for b in range(B):
            kmask = kmask_BS[b] if kmask_BS is not None else None
            out_H = torch.maximum(out_H, _block_max(q[b], k[b], scale, causal, kmask))
        return out_H
    q_NHD, k_NHD = q.reshape(B * T, H, -1), k.reshape(B * T, H, -1)
    kmask_N = kmask_BS.reshape(B * T) if kmask_BS is not None else None
    bounds = cu_seqlens.tolist()
    for s0, s1 in zip(bounds[:-1], bounds[1:]):
        kmask = kmask_N[s0:s1] if kmask_N is not None else None
        out_H = torch.maximum(out_H, _block_max(q_NHD[s0:s1], k_NHD[s0:s1], scale, causal, kmask))
    return out_H
