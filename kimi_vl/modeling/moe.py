"""Mixture of experts with a sigmoid router and aux-loss-free load balancing (DeepSeek-V3, Kimi K2 / Linear).

Routing per token (router in fp32):
    s = sigmoid(W_r x)                                  [E] affinities
    choose top-k of (s + b) (b = expert bias, optionally restricted to the best ``topk_group`` of ``n_group``
    groups, a group scored by the sum of its top-2)
    weights = s[chosen] / sum(s[chosen]) * routed_scaling_factor      (renormalised when ``norm_topk_prob``)
    y = sum_k weights_k * expert_k(x) + shared_experts(x)

Aux-loss-free balancing: ``b`` only shifts which experts are chosen, never the weights. While training,
each router counts the tokens routed to every expert (no gradient); the trainer calls
``KimiVLForCausalLM.update_moe_bias()`` after each optimizer step, which moves ``b`` by
``rate * sign(mean_load - load)`` and returns the load statistics to log.

Expert weights are stacks ``gate_proj``/``up_proj`` ``[E, I, D]`` and ``down_proj`` ``[E, D, I]`` (a batch of
matrices for Muon). Dispatch sorts token copies by expert and runs one matmul per expert that got tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kimi_vl.modeling.mlp import SwiGLU


class Router(nn.Module):
    """Sigmoid top-k router with group-limited choice and an expert-score correction bias."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, n_group: int, topk_group: int,
                 routed_scaling_factor: float, norm_topk_prob: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts))
        self.register_buffer("tokens_per_expert", torch.zeros(num_experts), persistent=False)
        self.num_experts, self.top_k = num_experts, top_k
        self.n_group, self.topk_group = n_group, topk_group
        self.routed_scaling_factor, self.norm_topk_prob = routed_scaling_factor, norm_topk_prob

    def forward(self, x_ND: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns ``(router_logits [N, E] fp32, weights [N, k] fp32, expert index [N, k])``."""
        logits_NE = F.linear(x_ND.float(), self.weight.float())
        scores_NE = logits_NE.sigmoid()
        choice_NE = scores_NE + self.e_score_correction_bias.float()
        if self.n_group > 1:
            choice_NE = self._limit_groups(choice_NE)
        idx_Nk = torch.topk(choice_NE, k=self.top_k, dim=-1, sorted=False)[1]
        weights_Nk = scores_NE.gather(1, idx_Nk)
        if self.norm_topk_prob:
            weights_Nk = weights_Nk / (weights_Nk.sum(dim=-1, keepdim=True) + 1e-20)
        return logits_NE, weights_Nk * self.routed_scaling_factor, idx_Nk

    def _limit_groups(self, choice_NE: torch.Tensor) -> torch.Tensor:
        n = choice_NE.shape[0]
        grouped = choice_NE.view(n, self.n_group, -1)
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)  # [N, G]
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1], True)
        return grouped.masked_fill(~keep[..., None], float("-inf")).view(n, -1)

    @torch.no_grad()
    def record_load(self, idx_Nk: torch.Tensor, token_mask_N: torch.Tensor | None) -> None:
        if token_mask_N is not None:
            idx_Nk = idx_Nk[token_mask_N]
        self.tokens_per_expert += torch.bincount(idx_Nk.flatten(), minlength=self.num_experts).to(
            self.tokens_per_expert.dtype)

    @torch.no_grad()
    def update_bias(self, rate: float) -> dict[str, float]:
        """Aux-loss-free step: ``b += rate * sign(mean_load - load)``; returns load stats and resets the counts."""
        load = self.tokens_per_expert.clone()
        total = load.sum()
        if total <= 0:
            return {"max_violation": 0.0, "tokens": 0.0}
        mean = total / self.num_experts
        self.e_score_correction_bias += rate * torch.sign(mean - load).to(self.e_score_correction_bias.dtype)
        self.tokens_per_expert.zero_()
        return {"max_violation": float((load.max() - mean) / mean), "tokens": float(total)}


class Experts(nn.Module):
    """``E`` SwiGLU experts stored as weight stacks."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.num_experts = num_experts

    def forward(self, x_ND: torch.Tensor, idx_Nk: torch.Tensor, weights_Nk: torch.Tensor) -> torch.Tensor:
        n, k = idx_Nk.shape
        flat_expert = idx_Nk.flatten()
        order = torch.argsort(flat_expert, stable=True)
        token_of_copy = order // k
        counts = torch.bincount(flat_expert, minlength=self.num_experts).tolist()
        x_sorted = x_ND[token_of_copy]
        w_sorted = weights_Nk.flatten()[order]
        out_sorted = torch.empty_like(x_sorted)
        # unbind once: its backward stacks the per-expert grads in one pass; indexing the stacked parameter
        # per expert (self.gate_proj[e]) made every expert's backward write a whole-parameter-sized zero grad
        gate, up, down = self.gate_proj.unbind(0), self.up_proj.unbind(0), self.down_proj.unbind(0)
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            xe = x_sorted[start:start + c]
            h = F.silu(F.linear(xe, gate[e])) * F.linear(xe, up[e])
            ye = F.linear(h, down[e]) * w_sorted[start:start + c, None]
            out_sorted[start:start + c] = ye.to(out_sorted.dtype)
            start += c
        out = torch.zeros_like(x_ND)
        return out.index_add_(0, token_of_copy, out_sorted)


class MoE(nn.Module):
    """Routed experts plus ``num_shared_experts`` always-on experts (one SwiGLU of width ``n_shared * I``)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.gate = Router(config.hidden_size, config.num_experts, config.num_experts_per_tok, config.n_group,
                           config.topk_group, config.routed_scaling_factor, config.norm_topk_prob)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)
        self.shared_experts = (SwiGLU(config.hidden_size, config.moe_intermediate_size * config.num_shared_experts)
                               if config.num_shared_experts > 0 else None)

    def forward(self, x_BTD: torch.Tensor, token_mask_BT: torch.Tensor | None = None) -> torch.Tensor:
        shape = x_BTD.shape
        x_ND = x_BTD.reshape(-1, shape[-1])
        _, weights_Nk, idx_Nk = self.gate(x_ND)
        if self.training:
            self.gate.record_load(idx_Nk, None if token_mask_BT is None else token_mask_BT.reshape(-1).bool())
        y_ND = self.experts(x_ND, idx_Nk, weights_Nk)
        if self.shared_experts is not None:
            y_ND = y_ND + self.shared_experts(x_ND)
        return y_ND.view(shape)
