"""MoonViT multi-head self-attention over a packed sequence, with the QK-Clip reporting protocol.

Attention is block-diagonal: every image / video chunk attends only to its own patches
(REFERENCE.md section 5). Backends (all compute the same function; tests compare them):

- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention varlen) on CUDA in bf16/fp16;
- ``masked``: one SDPA call with a ``[P, P]`` block-diagonal boolean mask (CPU; memory ~P^2);
- ``loop``: one SDPA call per segment (the reference; any device, any length);
- padded input ``[N, L, D]`` with a key-padding mask (``MoonViT.forward_padded``, the speed baseline).

QK-Clip (docs/INTERFACES.md, MHA rule): ``track_max_logits`` turns on recording of the per-head max of
``scale * q_i . k_j`` (after RoPE, visible pairs only) into ``max_logits_H`` via
``kernels.qk_max.max_logits_per_head``; ``qk_clip_(gamma_H)`` scales head h's q and k rows (and biases)
by ``sqrt(gamma_h)``.

Shapes: ``P`` packed patches, ``N`` segments, ``L`` padded length, ``H`` heads, ``D`` head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.host_ints import host_ints
from kernels.qk_max import max_logits_per_head
from kernels.rope2d import rope_2d
from kernels.rows import scale_rows_


@dataclass
class AttentionLayout:
    """How the tokens of one forward are grouped: packed (``cu_seqlens``) or padded (``key_padding_mask``)."""

    cu_seqlens: torch.Tensor | None = None  # int32 [N + 1] (packed)
    max_seqlen: int = 0
    backend: str = "loop"  # resolved: varlen | masked | loop | padded
    block_mask_PP: torch.Tensor | None = None  # bool [P, P] for "masked"
    key_padding_mask_NL: torch.Tensor | None = None  # bool [N, L], True = real token (padded; cu_seqlens too)
    # packed with a trailing padding segment (MoonViTConfig.row_bucket): the real chunks' bounds [N] (the rows
    # past its end are padding, left out of the QK max statistic); None: every row is real
    score_cu_seqlens: torch.Tensor | None = None


def block_diagonal_mask(segment_P: torch.Tensor) -> torch.Tensor:
    """bool ``[P, P]``: True where query and key belong to the same segment (``segment_P``: segment id per token)."""
    return segment_P[:, None] == segment_P[None, :]


def resolve_backend(requested: str, x: torch.Tensor, total: int, masked_max_len: int) -> str:
    """Pick the concrete backend for ``requested`` ("auto" or a name) on ``x``'s device and dtype."""
    if requested != "auto":
        return requested
    if x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and _varlen_available():
        return "varlen"
    return "masked" if total <= masked_max_len else "loop"


def _varlen_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


class MoonViTAttention(nn.Module):
    """q/k/v projections with bias (one fused matmul), 2-D RoPE on q and k (one fused kernel on CUDA), non-causal
    attention, output projection."""

    def __init__(self, width: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = width // num_heads
        self.scale = self.head_dim**-0.5
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)
        self.qk_clip_num_heads = num_heads
        self.track_max_logits = False
        self.register_buffer("max_logits_H", torch.full((num_heads,), float("-inf")), persistent=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: AttentionLayout) -> torch.Tensor:
        """``x [P, W]`` (packed) or ``[N, L, W]`` (padded); ``cos/sin`` fp32 ``[..., D]`` matching ``x``."""
        q, k, v = self._qkv(x)
        q, k = rope_2d(q, k, cos, sin)  # one fused launch on CUDA (kernels/rope2d), apply_rope_2d's maths
        if self.track_max_logits:
            self._record_max_logits(q, k, layout)
        if layout.backend == "padded":
            out = self._padded(q, k, v, layout.key_padding_mask_NL)
        elif layout.backend == "varlen":
            out = self._varlen(q, k, v, layout)
        elif layout.backend == "masked":
            out = self._sdpa(q, k, v, layout.block_mask_PP)
        elif layout.backend == "loop":
            out = self._loop(q, k, v, layout.cu_seqlens)
        else:
            raise ValueError(f"unknown attention backend {layout.backend!r}")
        return self.out_proj(out.reshape(x.shape))

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k, v [..., H, D]`` from ONE matmul with the three projections' weights and biases concatenated
        (the parameters stay separate: checkpoints, the kimi_k25 key map, Muon and QK-Clip see three matrices).
        The three are strided views of the ``[..., 3, H, D]`` product; their gradients meet in one buffer."""
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
        qkv = F.linear(x, weight, bias).view(*x.shape[:-1], 3, self.num_heads, self.head_dim)
        return qkv.unbind(-3)

    @staticmethod
    def _sdpa(q_THD: torch.Tensor, k_THD: torch.Tensor, v_THD: torch.Tensor,
              mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = (t.transpose(0, 1)[None] for t in (q_THD, k_THD, v_THD))  # [1, H, T, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out[0].transpose(0, 1)

    def _loop(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        bounds = host_ints(cu_seqlens)
        outs = [self._sdpa(q[a:b], k[a:b], v[a:b], None) for a, b in zip(bounds[:-1], bounds[1:])]
        return torch.cat(outs) if outs else q

    @staticmethod
    def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout) -> torch.Tensor:
        from torch.nn.attention.varlen import varlen_attn

        cu = layout.cu_seqlens.to(device=q.device, dtype=torch.int32)
        return varlen_attn(q, k, v, cu, cu, layout.max_seqlen, layout.max_seqlen)

    @staticmethod
    def _padded(q_NLHD: torch.Tensor, k_NLHD: torch.Tensor, v_NLHD: torch.Tensor,
                keep_NL: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in (q_NLHD, k_NLHD, v_NLHD))  # [N, H, L, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep_NL[:, None, None, :])
        return out.transpose(1, 2)

    @torch.no_grad()
    def _record_max_logits(self, q: torch.Tensor, k: torch.Tensor, layout: AttentionLayout) -> None:
        cu_seqlens = layout.cu_seqlens
        if layout.backend == "padded":  # padded query rows must not count: score the real tokens only
            q, k = q[layout.key_padding_mask_NL], k[layout.key_padding_mask_NL]
        elif layout.score_cu_seqlens is not None:  # packed with a padding segment at the end: drop it
            cu_seqlens = layout.score_cu_seqlens
            rows = host_ints(cu_seqlens)[-1]
            q, k = q[:rows], k[:rows]
        step = max_logits_per_head(q[None], k[None], self.scale, causal=False, cu_seqlens=cu_seqlens)
        self.max_logits_H.copy_(torch.maximum(self.max_logits_H, step.to(self.max_logits_H)))

    @torch.no_grad()
    def qk_clip_(self, gamma_H: torch.Tensor) -> None:
        """Scale head h's rows of ``W_q, b_q, W_k, b_k`` by ``sqrt(gamma_H[h])``; heads at 1 stay bit-identical
        (a product with 1.0 is exact). All on the device: no host read of gamma."""
        if gamma_H.shape != (self.num_heads,):
            raise ValueError(f"gamma_H must be [{self.num_heads}], got {tuple(gamma_H.shape)}")
        root_R = gamma_H.detach().to(device=self.q_proj.weight.device, dtype=torch.float32).sqrt()
        root_R = root_R.repeat_interleave(self.head_dim)  # head h's rows are [h * head_dim, (h + 1) * head_dim)
        for lin in (self.q_proj, self.k_proj):
            scale_rows_(lin.weight, root_R)
            scale_rows_(lin.bias, root_R)
