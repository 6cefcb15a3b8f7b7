"""``LayerNorm``: ``nn.LayerNorm`` (same parameters, same checkpoint keys) through the fused Triton kernel on CUDA.

Under bf16 autocast ``F.layer_norm`` runs in fp32 and returns fp32, so each of the tower's norms cost a cast of
its input, the norm, a cast of its output at the next matmul, and as many backward copies plus PyTorch's
separate weight/bias gradient kernel (~4.5 ms of a batch-24 training step on an H100 for 26 norms, session 13's
trace). ``kernels.norm.layer_norm`` does it in one pass each way: fp32 statistics and affine map, the output in the
input's dtype (where the next matmul would have rounded it). On the PyTorch path (CPU, or
``KVL_NORM_BACKEND=torch``) and without an affine map it is ``nn.LayerNorm`` itself.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.norm import layer_norm, resolve_backend


class LayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None or self.bias is None or len(self.normalized_shape) != 1 \
                or resolve_backend(None, x.device, "LayerNorm") == "torch":
            return super().forward(x)
        return layer_norm(x, self.weight, self.bias, self.eps)
