"""The LM head, and its next-token loss computed with or without returning the logits.

:class:`LMHead` is an ``nn.Linear`` (state-dict key ``lm_head.weight``, tying and transformers' accessors
unchanged). Called with targets it returns each row's cross entropy instead of the logits, through
:func:`kernels.cross_entropy.linear_cross_entropy`: on CUDA the logits are written once and overwritten by their
gradient in the same pass that takes the loss, so a training step reads them once and never holds a second
logits-sized buffer (``kernels/cross_entropy/README.md``). Going through the module call keeps FSDP2's and DDP's
hooks on the head.

Shapes: hidden ``x_BLD [B, L, D]``; ``targets_BL [B, L]`` (class ids, ``IGNORE`` = -100); row losses ``[B, L]``
fp32 (0 at ignored targets).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.cross_entropy import linear_cross_entropy

IGNORE = -100


def causal_targets(labels_BL: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """Row t's target: ``labels[:, t + 1]``; the last row's, and with ``cu_seqlens`` (packed documents over the
    flattened rows) each document's last row's, is ``IGNORE``, so documents never predict each other."""
    targets = torch.full_like(labels_BL, IGNORE)
    targets[:, :-1] = labels_BL[:, 1:]
    if cu_seqlens is not None:
        flat = targets.reshape(-1)
        flat[cu_seqlens[1:-1].to(torch.long) - 1] = IGNORE
        targets = flat.view_as(labels_BL)
    return targets


class LMHead(nn.Linear):
    """``nn.Linear(hidden, vocab, bias=False)``; ``head(x)`` gives logits, ``head(x, targets)`` per-row losses."""

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is None:
            return super().forward(x)
        if self.bias is not None:
            raise ValueError("LMHead: the per-row loss path (targets given) has no bias term; build it with bias=False")
        w = self.weight
        device = x.device.type
        if torch.is_autocast_enabled(device):  # what F.linear would compute in under autocast
            dtype = torch.get_autocast_dtype(device)
            x, w = x.to(dtype), w.to(dtype)
        with torch.autocast(device, enabled=False):
            return linear_cross_entropy(x, w, targets, ignore_index=IGNORE, reduction="none")
