"""Full-matrix specification of the per-head max pre-softmax logit (the QK-Clip statistic).

Source: Kimi K2 / MuonClip (REFERENCE.md section 4): ``S_max^h = max over visible (i, j) of scale * q_i . k_j``.
This file builds the whole ``[B, H, T, S]`` logit tensor and the whole visibility mask; it is the
readable oracle the chunked and Triton versions are tested against, not something to run on long sequences.

Shapes: q ``[B, T, H, D]``, k ``[B, S, H, D]``, key_padding_mask ``[B, S]`` (True/1 = real key),
cu_seqlens ``[N + 1]`` int over the flattened ``B * T`` tokens (requires ``T == S``).
"""

from __future__ import annotations

import torch


def visibility_mask(
    B: int, T: int, S: int, causal: bool, cu_seqlens: torch.Tensor | None, key_padding_mask: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor:
    """Boolean ``[B, T, S]``: True where query i may see key j.

    causal: key j visible from query i iff ``j <= i + (S - T)`` (bottom-right alignment, as flash-attn).
    cu_seqlens: only pairs inside the same segment of the flattened ``B * T`` token axis are visible.
    """
    vis_BTS = torch.ones(B, T, S, dtype=torch.bool, device=device)
    if causal:
        i = torch.arange(T, device=device)[:, None]
        j = torch.arange(S, device=device)[None, :]
        vis_BTS &= (j <= i + (S - T))[None]
    if cu_seqlens is not None:
        seg = torch.zeros(B * T, dtype=torch.long, device=device)
        bounds = cu_seqlens.to(device=device, dtype=torch.long)
        seg[bounds[1:-1]] += 1
        seg = seg.cumsum(0).view(B, T)  # [B, T] segment id of each token
        vis_BTS &= seg[:, :, None] == seg[:, None, :]
    if key_padding_mask is not None:
        vis_BTS &= key_padding_mask.to(device=device).bool()[:, None, :]
    return vis_BTS


def max_logits_per_head_naive(
    q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool,
    cu_seqlens: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-head max of ``scale * q_i . k_j`` over visible pairs, fp64 maths, fp32 ``[H]`` result (-inf if none)."""
    B, T, H, _ = q.shape
    S = k.shape[1]
    logits_BHTS = torch.einsum("bthd,bshd->bhts", q.double(), k.double()) * scale
    vis_BTS = visibility_mask(B, T, S, causal, cu_seqlens, key_padding_mask, q.device)
    logits_BHTS = logits_BHTS.masked_fill(~vis_BTS[:, None], float("-inf"))
    return logits_BHTS.amax(dim=(0, 2, 3)).float()
