"""Multi-head Latent Attention without positional encoding (NoPE MLA): the global layers of Kimi Linear.

DeepSeek-V2/V3 layout (arXiv 2405.04434), used by Kimi Linear with no rotary embedding (KDA is the only
positional mechanism):
    q        = W_q x                      or  W_qb RMSNorm(W_qa x)       (low rank, ``q_lora_rank``)
    [c, kr]  = W_kva x                    c: latent [R], kr: shared "rope" key part [dr] (not rotated)
    [kn, v]  = W_kvb RMSNorm(c)           per head: kn [dn], v [V]
    k_h      = [kn_h, kr]                 kr shared by all heads;  scale = (dn + dr)^-1/2
Cached decode with the latent cache uses the absorbed form (scores against ``[c, kr]`` with
``q_nope W_uk`` as query, values ``c`` then ``W_uv``), which never re-expands the cache.

QK-Clip protocol (docs/INTERFACES.md): ``qk_clip_num_heads``, ``track_max_logits``, the ``max_logits_H``
buffer, and ``qk_clip_(gamma_H)`` (q_nope and k_nope rows by sqrt(gamma), q_rope rows by gamma).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.linear import shared_input_linear
from kernels.mla_expand import expand_kv
from kernels.rows import scale_rows_
from kimi_vl.modeling.cache import MLALayerCache
from kimi_vl.modeling.masks import MaskSpec
from kimi_vl.modeling.norm import RMSNorm

_FLEX = None
ABSORB_MAX_QUERY = 16  # cached steps with at most this many new tokens use the absorbed latent form


def _flex_attention():
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


class MLAttention(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.q_lora_rank, self.kv_lora_rank = config.q_lora_rank, config.kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.qk_dim = self.nope_dim + self.rope_dim
        self.scaling = self.qk_dim ** -0.5
        self.dropout = config.attention_dropout
        d, h = config.hidden_size, self.num_heads
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(d, h * self.qk_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(d, self.q_lora_rank, bias=config.attention_bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank)
            self.q_b_proj = nn.Linear(self.q_lora_rank, h * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, self.kv_lora_rank + self.rope_dim, bias=config.attention_bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, h * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(h * self.v_dim, d, bias=config.attention_bias)
        self.use_flex = config.attn_backend == "flex" or (config.attn_backend == "auto" and torch.cuda.is_available())
        self.eager = config.attn_backend == "eager"
        self.qk_clip_num_heads = h
        self.track_max_logits = False
        self.register_buffer("max_logits_H", torch.full((h,), float("-inf")), persistent=False)

    def _project(self, x_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query ``[B, T, H, dq]``, normed latent ``[B, T, R]`` and ``k_rope`` ``[B, T, dr]``. The two projections
        of x (``q_proj`` or ``q_a_proj``, and ``kv_a_proj_with_mqa``) are one autograd node, so that x has one
        consumer (:func:`kernels.linear.shared_input_linear`)."""
        q_lin = self.q_proj if self.q_lora_rank is None else self.q_a_proj
        q, kv_a = shared_input_linear(x_BTD, [q_lin.weight, self.kv_a_proj_with_mqa.weight],
                                      [q_lin.bias, self.kv_a_proj_with_mqa.bias])
        if self.q_lora_rank is not None:
            q = self.q_b_proj(self.q_a_layernorm(q))
        ckv, k_rope = torch.split(kv_a, [self.kv_lora_rank, self.rope_dim], dim=-1)
        return q.view(*x_BTD.shape[:2], self.num_heads, self.qk_dim), self.kv_a_layernorm(ckv), k_rope

    def _expand(self, ckv_BSR: torch.Tensor, krope_BSd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, _ = ckv_BSR.shape
        kv = self.kv_b_proj(ckv_BSR).view(b, s, self.num_heads, self.nope_dim + self.v_dim)
        return expand_kv(kv, krope_BSd, self.nope_dim)  # [B, S, H, dq], [B, S, H, V]

    def forward(self, x_BTD: torch.Tensor, mask: MaskSpec, cache: MLALayerCache | None = None) -> torch.Tensor:
        b, t, _ = x_BTD.shape
        q_BTHd, ckv, krope = self._project(x_BTD)
        if cache is not None and cache.mode == "latent":
            had_past = cache.seq_length() > 0
            ckv, krope = cache.update(ckv, krope)
            if had_past and t <= ABSORB_MAX_QUERY:
                return self.o_proj(self._absorbed(q_BTHd, ckv, krope, mask, cache.joint()).reshape(b, t, -1))
        k_BSHd, v_BSHV = self._expand(ckv, krope)
        q, k, v = q_BTHd.transpose(1, 2), k_BSHd.transpose(1, 2), v_BSHV.transpose(1, 2)
        if cache is not None and cache.mode == "expanded":
            k, v = cache.update(k, v)
        if self.track_max_logits and self.training:
            self._track(q_BTHd, k_BSHd, mask)
        out_BHTV = self._attend(q, k, v, mask)
        return self.o_proj(out_BHTV.transpose(1, 2).reshape(b, t, -1))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: MaskSpec) -> torch.Tensor:
        """q ``[B, H, T, dq]``, k ``[B, H, S, dq]``, v ``[B, H, S, V]`` -> ``[B, H, T, V]``."""
        dropout = self.dropout if self.training else 0.0
        if mask.block_mask is not None:
            return _flex_attention()(q, k, v, block_mask=mask.block_mask, scale=self.scaling)
        if self.eager:
            return _eager_attention(q, k, v, mask.dense_B1TS, mask.is_causal, self.scaling)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense_B1TS, dropout_p=dropout,
                                              is_causal=mask.is_causal, scale=self.scaling)

    def _absorbed(self, q_BTHd: torch.Tensor, ckv_BSR: torch.Tensor, krope_BSd: torch.Tensor,
                  mask: MaskSpec, key_BSE: torch.Tensor | None = None) -> torch.Tensor:
        """Attention against the latent cache without expanding it; returns ``[B, T, H, V]``.

        Every head attends the same key ``[c, kr]`` and value ``c``, so the heads are folded into the query rows
        of one attention head (row ``h T + t``): the cache is read once per step, not copied per head.
        ``key_BSE``: ``[c, kr]`` as one tensor when the cache keeps it so (else concatenated here). The attention
        is two batched matmuls around an fp32 softmax (:func:`_latent_attention`)."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        w_uk, w_uv = w[:, : self.nope_dim], w[:, self.nope_dim:]  # [H, dn, R], [H, V, R]
        q_nope, q_rope = torch.split(q_BTHd, [self.nope_dim, self.rope_dim], dim=-1)
        q_lat = torch.einsum("bthn,hnr->bhtr", q_nope, w_uk)
        query = torch.cat([q_lat, q_rope.transpose(1, 2)], dim=-1)  # [B, H, T, R+dr]
        b, h, t, e = query.shape
        key = torch.cat([ckv_BSR, krope_BSd], dim=-1) if key_BSE is None else key_BSE
        dense = None if mask.dense_B1TS is None else mask.dense_B1TS[:, 0]  # [B, T, S]
        if dense is not None and t > 1:  # row h T + t of the folded query takes mask row t
            dense = dense[:, None].expand(-1, h, -1, -1).reshape(dense.shape[0], h * t, -1)
        out_lat = _latent_attention(query.reshape(b, h * t, e), key, ckv_BSR, dense, self.scaling)
        return torch.einsum("bhtr,hvr->bthv", out_lat.view(b, h, t, -1), w_uv)

    @torch.no_grad()
    def _track(self, q_BTHd: torch.Tensor, k_BSHd: torch.Tensor, mask: MaskSpec) -> None:
        from kernels.qk_max import max_logits_per_head

        if q_BTHd.shape[1] != k_BSHd.shape[1]:
            raise ValueError("MLAttention: QK-Clip tracking needs a forward without a cache (T == S)")
        step_max = max_logits_per_head(q_BTHd, k_BSHd, self.scaling, True, cu_seqlens=mask.cu_seqlens,
                                       key_padding_mask=mask.key_padding_mask_BS)
        self.max_logits_H.copy_(torch.maximum(self.max_logits_H, step_max.to(self.max_logits_H)))

    @torch.no_grad()
    def qk_clip_(self, gamma_H: torch.Tensor) -> None:
        """Rescale q_nope/k_nope rows by sqrt(gamma) and q_rope rows by gamma per head; k_rope, V, O untouched."""
        if gamma_H.shape != (self.num_heads,):
            raise ValueError(f"MLAttention.qk_clip_: gamma_H must be [{self.num_heads}], got {tuple(gamma_H.shape)}")
        q_lin = self.q_proj if self.q_lora_rank is None else self.q_b_proj
        g_H1 = gamma_H.detach().to(device=q_lin.weight.device, dtype=torch.float32)[:, None]
        root_H1 = g_H1.sqrt()
        rope_dim = self.qk_dim - self.nope_dim
        # per output row, head-major: q rows [nope | rope] per head, kv_b rows [k_nope | v] per head (v: 1.0, exact)
        q_R = torch.cat([root_H1.expand(-1, self.nope_dim), g_H1.expand(-1, rope_dim)], dim=1).reshape(-1)
        kv_R = torch.cat([root_H1.expand(-1, self.nope_dim), torch.ones_like(g_H1).expand(-1, self.v_dim)],
                         dim=1).reshape(-1)
        scale_rows_(q_lin.weight, q_R)  # DTensor-aware (FSDP2 shards these rows), no host read
        scale_rows_(self.kv_b_proj.weight, kv_R)


def _latent_attention(q_BQE: torch.Tensor, key_BSE: torch.Tensor, value_BSR: torch.Tensor,
                      visible_BQS: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Few query rows against one shared key/value head: ``softmax(q k^T scale) v`` as two batched matmuls, scores
    and softmax in fp32, probabilities in v's dtype for the second matmul. SDPA's kernels give one such head a
    single thread block that walks every key (7.7 ms at 131,072 keys against 0.13 ms here, H100,
    ``kimi_vl/benchmarks/bench_mla_decode.py``); a matmul spreads the keys over the GPU. ``visible_BQS``: bool,
    broadcastable, True = attend."""
    if q_BQE.is_cuda:  # bf16 inputs, fp32 scores
        scores = torch.bmm(q_BQE, key_BSE.transpose(1, 2), out_dtype=torch.float32)
    else:
        scores = torch.bmm(q_BQE.float(), key_BSE.float().transpose(1, 2))
    scores = scores * scale
    if visible_BQS is not None:
        scores = scores.masked_fill(~visible_BQS, float("-inf"))
    return torch.bmm(scores.softmax(-1).to(value_BSR.dtype), value_BSR)


def _eager_attention(q, k, v, dense_B1TS, is_causal: bool, scale: float) -> torch.Tensor:
    """Reference attention in fp32 (masked with ``where`` before the softmax)."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if is_causal:
        t, s = scores.shape[-2:]
        dense_B1TS = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    if dense_B1TS is not None:
        scores = scores.masked_fill(~dense_B1TS, float("-inf"))
    return torch.matmul(scores.softmax(-1), v.float()).to(q.dtype)
