"""Dense SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))`` (Shazeer 2020; the dense layer of Kimi Linear).

The gate and up projections run as one matmul against their concatenated weights (the parameters stay
separate, under the checkpoint names), and ``kernels.norm.silu_mul`` reads that ``[..., 2I]`` output in one
pass (fused Triton on CUDA) and writes its gradient as one tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.norm import silu_mul


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        gate_up = F.linear(x_BTD, torch.cat([self.gate_proj.weight, self.up_proj.weight]))  # [B, T, 2I]
        return self.down_proj(silu_mul(gate_up))
