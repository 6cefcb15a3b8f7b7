"""The Kimi Delta Attention token mixer (Kimi Linear, arXiv 2510.26692; ``../shared/REFERENCE.md`` section 1).

    q, k, v = W_q x, W_k x, W_v x                           [B, T, H*K] each
    q, k, v = SiLU(short_conv([q|k|v]))                     depthwise causal, kernel W, no bias, varlen aware
    g       = gate(W_fb W_fa x)  (inside the operator)      -exp(A_log) softplus(. + dt_bias)  ("unbounded")
                                                            or lower_bound * sigmoid(exp(A_log) (. + dt_bias))
    beta    = sigmoid(W_b x)                                [B, T, H] fp32
    o       = KDA(l2norm(q), l2norm(k), v, g, beta)         kernels.kda (chunk for prefill, recurrent for decode)
    y       = W_o [ RMSNorm_head(o) * w * sigmoid(W_gb W_ga x) ]

Padding positions (``attention_mask == 0``) are zeroed before the projections: a zero input leaves the
conv output, k, v and hence the recurrent state exactly zero, so left-padded batches match unpadded
rows. Values share the key head count (HV = H) and head dim (V = K), as in the released model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kernels.kda import chunk_kda, fused_recurrent_kda
from kernels.linear import shared_input_linear
from kernels.short_conv import causal_conv1d, causal_conv1d_update
from kimi_vl.modeling.cache import KDALayerCache
from kimi_vl.modeling.norm import GatedRMSNorm

# Rows of the small input map (f_a | g_a | b, 2K + H = 262 in the small flavor) are padded with zeros to a multiple
# of this, so that its output's rows (and the f_a / g_a views the gate projections read) are 16-byte aligned: with
# 262 columns cuBLAS ran that GEMM, its two backward GEMMs and the two gate projections as sm80 ``align2`` kernels
# (H200, session 28 call2: the small hybrid's GEMM time a step 33.2 ms at 262 rows, 30.7-31.0 at 264). 1: no padding.
SMALL_PROJ_ALIGN = 8


class KDALayer(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = config.linear_num_heads, config.linear_head_dim
        self.conv_size = config.linear_conv_kernel_dim
        self.lower_bound = config.kda_gate_lower_bound
        d, hk, k = config.hidden_size, config.linear_num_heads * config.linear_head_dim, config.linear_head_dim
        self.q_proj = nn.Linear(d, hk, bias=False)
        self.k_proj = nn.Linear(d, hk, bias=False)
        self.v_proj = nn.Linear(d, hk, bias=False)
        self.conv1d_weight = nn.Parameter(torch.empty(3 * hk, self.conv_size))  # depthwise, q|k|v channels
        self.f_a_proj = nn.Linear(d, k, bias=False)
        self.f_b_proj = nn.Linear(k, hk, bias=False)
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.dt_bias = nn.Parameter(torch.empty(hk))
        self.b_proj = nn.Linear(d, self.num_heads, bias=False)
        self.g_a_proj = nn.Linear(d, k, bias=False)
        self.g_b_proj = nn.Linear(k, hk, bias=False)
        self.o_norm = GatedRMSNorm(k, eps=config.rms_norm_eps)
        self.o_proj = nn.Linear(hk, d, bias=False)

    def forward(self, x_BTD: torch.Tensor, attention_mask_BT: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None, cache: KDALayerCache | None = None) -> torch.Tensor:
        if attention_mask_BT is not None:
            x_BTD = x_BTD * attention_mask_BT[:, :, None].to(x_BTD.dtype)
        b, t, _ = x_BTD.shape
        qkv, small = self._input_proj(x_BTD)
        decode = cache is not None and cache.recurrent_state is not None and t == 1
        qkv = self._conv(qkv, cu_seqlens, cache, decode)
        q, k, v = (z.reshape(b, t, self.num_heads, self.head_dim) for z in qkv.chunk(3, dim=-1))
        pad = small.shape[-1] - 2 * self.head_dim - self.num_heads
        f_a, g_a, b_raw, _ = small.split([self.head_dim, self.head_dim, self.num_heads, pad], dim=-1)
        raw_gate = self.f_b_proj(f_a).view(b, t, self.num_heads, self.head_dim)
        beta = torch.sigmoid(b_raw.float())
        op = fused_recurrent_kda if decode else chunk_kda
        o, state = op(q, k, v, raw_gate, beta, initial_state=None if cache is None else cache.recurrent_state,
                      output_final_state=cache is not None, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                      A_log=self.A_log, dt_bias=self.dt_bias, lower_bound=self.lower_bound, cu_seqlens=cu_seqlens)
        if cache is not None:
            cache.store(recurrent_state=state)
        gate = self.g_b_proj(g_a).view(b, t, self.num_heads, self.head_dim)
        return self.o_proj(self.o_norm(o, gate).reshape(b, t, -1))

    def _input_proj(self, x_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``q|k|v`` ``[B, T, 3HK]`` and ``f_a|g_a|b|0`` ``[B, T, 2K + H + pad]``: two GEMMs of x, one autograd node (x
        has one consumer: its gradient is accumulated in place, :func:`kernels.linear.shared_input_linear`). The
        small map gets zero rows up to a multiple of ``SMALL_PROJ_ALIGN`` (see there)."""
        w_qkv = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        small = [self.f_a_proj.weight, self.g_a_proj.weight, self.b_proj.weight]
        pad = -sum(w.shape[0] for w in small) % SMALL_PROJ_ALIGN
        if pad:
            small.append(self.b_proj.weight.new_zeros(pad, x_BTD.shape[-1]))
        return shared_input_linear(x_BTD, [w_qkv, torch.cat(small)])

    def _conv(self, qkv_BTC: torch.Tensor, cu_seqlens: torch.Tensor | None, cache: KDALayerCache | None,
              decode: bool) -> torch.Tensor:
        if decode:
            y, state = causal_conv1d_update(qkv_BTC[:, 0], cache.conv_state, self.conv1d_weight, activation="silu")
            cache.store(conv_state=state)
            return y[:, None]
        y, state = causal_conv1d(qkv_BTC, self.conv1d_weight, activation="silu", cu_seqlens=cu_seqlens,
                                 initial_state=None if cache is None else cache.conv_state,
                                 output_final_state=cache is not None)
        if cache is not None:
            cache.store(conv_state=state)
        return y


def kda_gate_torch(raw_BTHK: torch.Tensor, A_log_H: torch.Tensor, dt_bias: torch.Tensor,
                   lower_bound: float | None) -> torch.Tensor:
    """The log-decay the operator computes in-kernel (reference for tests): fp32 ``[B, T, H, K]``, all <= 0."""
    h = A_log_H.shape[0]
    x = raw_BTHK.float() + dt_bias.float().view(h, -1)
    if lower_bound is None:
        return -A_log_H.float().exp()[:, None] * F.softplus(x, threshold=20.0)
    return lower_bound * torch.sigmoid(A_log_H.float().exp()[:, None] * x)


def kda_init_values(layer: KDALayer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Initial ``A_log = log U(1, 16)``, ``dt_bias = softplus^-1(dt)`` with ``dt ~ logU(1e-3, 1e-1)`` clamped
    >= 1e-4 (REFERENCE s. 1), and the depthwise conv ``~ U(+-1/sqrt(W))`` (PyTorch's Conv1d default)."""
    with torch.no_grad():
        a_log = torch.empty_like(layer.A_log).uniform_(1.0, 16.0).log()
        dt = torch.empty_like(layer.dt_bias).uniform_(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
        dt_bias = dt + torch.log(-torch.expm1(-dt))
        bound = 1.0 / math.sqrt(layer.conv_size)
        conv = torch.empty_like(layer.conv1d_weight).uniform_(-bound, bound)
    return a_log, dt_bias, conv
