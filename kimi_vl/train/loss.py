"""Next-token loss with per-modality and per-source breakdowns.

Shapes: ``logits_BLV [B, L, V]``, ``labels_BL [B, L]`` (unshifted, -100 = ignore), id maps
``ids_BL [B, L]``, ``position_ids_BL [B, L]``. The target at position t is predicted from
``logits[t-1]``. In a packed row the first token of a document would be "predicted" from the last
token of the previous one; such targets (``position_ids == 0``) are masked out. The cross entropy is
``kernels.cross_entropy`` (fused Triton on CUDA; ``F.cross_entropy`` on fp32 logits on CPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels.cross_entropy import cross_entropy
from kimi_vl.modeling.head import IGNORE, causal_targets

IGNORE_INDEX = IGNORE


def token_losses(logits_BLV: torch.Tensor, labels_BL: torch.Tensor,
                 position_ids_BL: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token cross entropy aligned to the *target* position: ``(loss_BL, mask_BL)``.

    ``loss_BL[:, t]`` is the loss of predicting ``labels[:, t]`` from ``logits[:, t-1]``; position 0
    and ignored targets (and document starts, when ``position_ids_BL`` is given) have
    ``mask == False`` and loss 0. Computed in fp32.

    Row t of the logits is scored against ``labels[:, t + 1]`` over all L rows (the last one ignored) rather
    than slicing ``logits[:, :-1]``: the fused kernel then writes the logits' gradient as one buffer, with no
    slice backward (a zero-filled copy the size of the logits). Per-row values are those of the sliced form.
    """
    rows_BL = cross_entropy(logits_BLV, causal_targets(labels_BL), ignore_index=IGNORE_INDEX, reduction="none")
    return align_row_losses(rows_BL, labels_BL, position_ids_BL)


def align_row_losses(rows_BL: torch.Tensor, labels_BL: torch.Tensor,
                     position_ids_BL: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_losses` from per-row losses ``rows_BL [B, L]`` fp32 (row t's loss against ``labels[:, t + 1]``,
    as the model returns them with ``return_logits=False``), without the logits."""
    B = labels_BL.shape[0]
    target_BL = labels_BL[:, 1:]
    loss_BL = torch.cat([rows_BL.new_zeros(B, 1), rows_BL[:, :-1]], dim=1)
    mask_BL = torch.cat([labels_BL.new_zeros(B, 1, dtype=torch.bool), target_BL != IGNORE_INDEX], dim=1)
    if position_ids_BL is not None:
        mask_BL = mask_BL & (position_ids_BL != 0)
    return loss_BL * mask_BL, mask_BL


def mean_loss(loss_BL: torch.Tensor, mask_BL: torch.Tensor) -> torch.Tensor:
    """Mean over unmasked targets (0 with a zero gradient path when nothing is unmasked)."""
    n = mask_BL.sum()
    return (loss_BL * mask_BL).sum() / n.clamp(min=1)


def breakdown_sums(loss_BL: torch.Tensor, mask_BL: torch.Tensor, ids_BL: torch.Tensor | None,
                   num_ids: int) -> torch.Tensor | None:
    """fp64 ``[2, num_ids]`` on the loss's device: per id, the summed loss and the count of unmasked targets.

    One pass (a ``[B*L, num_ids]`` one-hot) and no host synchronisation, so a training step can read it after
    its backward and optimizer step are queued; ids outside ``range(num_ids)`` are ignored. ``None`` without ids.
    """
    if ids_BL is None or not num_ids:
        return None
    ids_N = ids_BL.reshape(-1).to(mask_BL.device)
    onehot_NK = (ids_N[:, None] == torch.arange(num_ids, device=ids_N.device)) & mask_BL.reshape(-1, 1)
    sums_K = (onehot_NK * loss_BL.detach().reshape(-1, 1).double()).sum(0)
    return torch.stack([sums_K, onehot_NK.sum(0).double()])


def breakdown_values(sums_2K: torch.Tensor | None, names: Sequence[str], prefix: str) -> dict[str, float]:
    """``{f"{prefix}/{name}": mean loss}`` from :func:`breakdown_sums` (one host transfer)."""
    if sums_2K is None:
        return {}
    sums, counts = sums_2K.tolist()
    return {f"{prefix}/{name}": s / c for name, s, c in zip(names, sums, counts) if c > 0}


def breakdown(loss_BL: torch.Tensor, mask_BL: torch.Tensor, ids_BL: torch.Tensor | None,
              names: Sequence[str], prefix: str) -> dict[str, float]:
    """``{f"{prefix}/{name}": mean loss}`` for every id present among the unmasked targets (one device pass, one
    host transfer, instead of two synchronisations per name)."""
    return breakdown_values(breakdown_sums(loss_BL, mask_BL, ids_BL, len(names)), names, prefix)
