"""Tiny attention models for the optimizer tests: an MHA and an MLA that implement the QK-Clip protocol.

They follow docs/INTERFACES.md ("QK-Clip") but are test doubles, not the suite's real layers.
Shapes: x ``[B, T, d]``; q, k ``[B, T, H, D]``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kernels.qk_max import max_logits_per_head
from kernels.qk_max.scale import scale_rows_


class _Tracks(nn.Module):
    def _init_tracking(self, num_heads: int) -> None:
        self.qk_clip_num_heads = num_heads
        self.track_max_logits = False
        self.register_buffer("max_logits_H", torch.full((num_heads,), float("-inf")), persistent=False)

    def _track(self, q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
        if self.track_max_logits:
            with torch.no_grad():
                step_max = max_logits_per_head(q, k, scale, causal=True)
                self.max_logits_H.copy_(torch.maximum(self.max_logits_H, step_max))


class TinyMHA(_Tracks):
    """Causal multi-head attention with q/k biases; MHA clip rule: q and k rows (and biases) by sqrt(gamma)."""

    def __init__(self, d: int, num_heads: int) -> None:
        super().__init__()
        self.h, self.dh = num_heads, d // num_heads
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self._init_tracking(num_heads)

    def qk(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.dh)
        k = self.k_proj(x).view(B, T, self.h, self.dh)
        return q, k, self.dh**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, scale = self.qk(x)
        self._track(q, k, scale)
        v = self.v_proj(x).view(B, T, self.h, self.dh)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))

    @torch.no_grad()
    def qk_clip_(self, gamma_H: torch.Tensor) -> None:
        rows = gamma_H.sqrt().repeat_interleave(self.dh)
        for lin in (self.q_proj, self.k_proj):
            scale_rows_(lin.weight, rows)
            scale_rows_(lin.bias, rows)


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the last dim of ``x [B, T, H, R]`` (R even)."""
    T, R = x.shape[1], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, R, 2, dtype=torch.float32) / R))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None]  # [T, R/2]
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class TinyMLA(_Tracks):
    """Multi-head latent attention with a decoupled rope part shared by all heads' keys.

    ``q_proj`` rows per head: ``[q_nope (dn), q_rope (dr)]``; ``kv_a_proj`` rows: ``[latent (c), k_rope (dr)]``;
    ``kv_b_proj`` rows per head: ``[k_nope (dn), v (dv)]``. Clip: q_nope and k_nope by sqrt(gamma), q_rope by
    gamma, shared k_rope, V and O untouched.
    """

    def __init__(self, d: int, num_heads: int, dn: int = 6, dr: int = 4, dv: int = 6, latent: int = 8) -> None:
        super().__init__()
        self.h, self.dn, self.dr, self.dv, self.c = num_heads, dn, dr, dv, latent
        self.q_proj = nn.Linear(d, num_heads * (dn + dr), bias=False)
        self.kv_a_proj = nn.Linear(d, latent + dr, bias=False)
        self.kv_a_norm = nn.RMSNorm(latent)
        self.kv_b_proj = nn.Linear(latent, num_heads * (dn + dv), bias=False)
        self.o_proj = nn.Linear(num_heads * dv, d, bias=False)
        self._init_tracking(num_heads)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.dn + self.dr)
        q = torch.cat([q[..., : self.dn], _rope(q[..., self.dn:])], dim=-1)
        a = self.kv_a_proj(x)
        k_rope = _rope(a[..., self.c:].unsqueeze(2)).expand(B, T, self.h, self.dr)
        kv = self.kv_b_proj(self.kv_a_norm(a[..., : self.c])).view(B, T, self.h, self.dn + self.dv)
        k = torch.cat([kv[..., : self.dn], k_rope], dim=-1)
        return q, k, kv[..., self.dn:], 1.0 / math.sqrt(self.dn + self.dr)

    def qk(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        q, k, _, scale = self.qkv(x)
        return q, k, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v, scale = self.qkv(x)
        self._track(q, k, scale)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale
        )
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))

    @torch.no_grad()
    def qk_clip_(self, gamma_H: torch.Tensor) -> None:
        s = gamma_H.sqrt()
        q_rows = torch.cat([s[:, None].expand(-1, self.dn), gamma_H[:, None].expand(-1, self.dr)], 1).reshape(-1)
        kv_rows = torch.cat([s[:, None].expand(-1, self.dn), torch.ones(self.h, self.dv)], 1).reshape(-1)
        scale_rows_(self.q_proj.weight, q_rows)
        scale_rows_(self.kv_b_proj.weight, kv_rows)


class TinyMoE(nn.Module):
    """Router + expert stacks ``[E, out, in]`` with a fused gate/up stack (declared via ``muon_row_splits``)."""

    def __init__(self, d: int, f: int, num_experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(d, num_experts, bias=False)
        self.experts_gate_up = nn.Parameter(torch.randn(num_experts, 2 * f, d) / math.sqrt(d))
        self.experts_down = nn.Parameter(torch.randn(num_experts, d, f) / math.sqrt(f))
        self.muon_row_splits = {"experts_gate_up": (f, f)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.router(x).softmax(-1)  # [B, T, E] dense mixture keeps every expert trained
        gu = torch.einsum("btd,efd->btef", x, self.experts_gate_up)
        g, u = gu.chunk(2, dim=-1)
        h = torch.einsum("btef,edf->bted", F.silu(g) * u, self.experts_down)
        return (w[..., None] * h).sum(2)


class TinyBlock(nn.Module):
    def __init__(self, d: int, num_heads: int, mla: bool, moe: bool) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(d)
        self.attn = TinyMLA(d, num_heads) if mla else TinyMHA(d, num_heads)
        self.mlp_norm = nn.RMSNorm(d)
        if moe:
            self.mlp = TinyMoE(d, 2 * d, 3)
        else:
            self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.self_attention_res_proj = nn.Parameter(torch.zeros(d))
        self.self_attention_res_norm = nn.RMSNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLM(nn.Module):
    """Embedding, blocks (MHA/MLA, dense/MoE), gate vectors, final norm and an LM head."""

    def __init__(self, vocab: int = 32, d: int = 16, num_heads: int = 2, layers: int = 2, moe: bool = True) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(TinyBlock(d, num_heads, mla=i % 2 == 1, moe=moe and i == 1) for i in range(layers))
        self.A_log = nn.Parameter(torch.zeros(num_heads))
        self.dt_bias = nn.Parameter(torch.zeros(d))
        self.norm = nn.RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids) + self.dt_bias + self.A_log.sum()
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
