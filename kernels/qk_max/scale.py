"""In-place per-row scaling of a weight for QK-Clip's ``qk_clip_`` (plain tensors and FSDP2 DTensors).

Lives in ``kernels`` so that both ``vision_encoder`` (MHA) and ``kimi_vl`` (MLA) can use it without
breaking the import direction.
"""

from __future__ import annotations

import torch


def scale_rows_(weight: torch.Tensor, row_scale: torch.Tensor) -> None:
    """``weight[r, ...] *= row_scale[r]`` in place; works on plain tensors and on FSDP2 DTensor params.

    For a DTensor the scale vector is made a replicated DTensor on the same mesh, so each rank only
    multiplies the rows of its own shard.
    """
    shape = (-1,) + (1,) * (weight.dim() - 1)
    scale = row_scale.to(device=weight.device, dtype=weight.dtype).reshape(shape)
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(weight, DTensor):
        scale = DTensor.from_local(scale, weight.device_mesh, [Replicate()] * weight.device_mesh.ndim)
    weight.mul_(scale)
