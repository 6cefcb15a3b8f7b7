"""Dense SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))`` (Shazeer 2020; the dense layer of Kimi Linear)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x_BTD)) * self.up_proj(x_BTD))
