"""``scale_rows_``: an in-place per-row scale of a weight that may be an FSDP2 shard (a ``DTensor``).

QK-Clip rescales some rows of the query/key projections (``kimi_vl/optim/qk_clip.py``). Under FSDP2 the weights are
``DTensor``s sharded along the rows, and a plain tensor cannot multiply them in place. The scale is laid out like the
weight from each rank's own full copy (``distribute_tensor(..., src_data_rank=None)``, no communication: every rank
holds the same, all-reduced, scale), so each rank scales exactly its own rows. Nothing is read back to the host.
"""

from __future__ import annotations

import torch


def scale_rows_(weight: torch.Tensor, scale_R: torch.Tensor) -> None:
    """``weight[r, ...] *= scale_R[r]`` in place (the scale cast to the weight's dtype first), for a plain tensor or
    a ``DTensor`` (any placements over dim 0)."""
    if scale_R.shape != (weight.shape[0],):
        raise ValueError(f"scale_rows_: scale_R must be [{weight.shape[0]}] for a weight of shape "
                         f"{tuple(weight.shape)}, got {tuple(scale_R.shape)}")
    scale = scale_R.detach().to(device=weight.device, dtype=weight.dtype).reshape(-1, *([1] * (weight.dim() - 1)))
    if hasattr(weight, "device_mesh"):  # a DTensor: FSDP2's sharded parameter
        from torch.distributed.tensor import distribute_tensor

        scale = distribute_tensor(scale, weight.device_mesh, weight.placements, src_data_rank=None)
    weight.mul_(scale)
