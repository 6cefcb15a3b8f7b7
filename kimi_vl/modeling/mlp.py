"""Dense SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))`` (Shazeer 2020; the dense layer of Kimi Linear).

The gate and up projections run as one matmul against their concatenated weights (the parameters stay
separate, under the checkpoint names), and ``kernels.norm.silu_mul`` reads that ``[..., 2I]`` output in one
pass (fused Triton on CUDA) and writes its gradient as one tensor. ``KVL_SWIGLU_IMPL=fused`` runs the activation
inside Triton GEMMs instead (``kernels/swiglu``; not the default until a GPU run times it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.norm import silu_mul
from kernels.swiglu import SwiGLUGemmFunction, resolve_impl


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        w_gate_up = torch.cat([self.gate_proj.weight, self.up_proj.weight])  # [2I, D]
        if resolve_impl(None, x_BTD.device) == "fused":
            return SwiGLUGemmFunction.apply(x_BTD, w_gate_up, self.down_proj.weight)
        return self.down_proj(silu_mul(F.linear(x_BTD, w_gate_up)))  # gate_up [B, T, 2I]
