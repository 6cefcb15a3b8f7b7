"""Model FLOPs of one training step (forward + backward = 3x forward), the numerator of MFU.

One formula for the backbone benchmark and the training app, so that their MFU numbers compare:

- language model, per token of a length-``seq`` row: ``6 x`` the matrix parameters a token passes through
  (everything but the input embedding; routed experts counted at ``k / E``; the LM head included), plus the
  sequence-mixing term per layer: causal MLA ``3 H (d_qk + d_v) seq`` (half of the ``seq^2`` pairs), KDA's
  chunked form ``3 H (6 K^2 + 3 C K + C^2)`` with chunk ``C = 64`` (independent of ``seq``);
- vision tower, per patch: ``6 x`` its parameters (the position table excluded: a lookup), plus non-causal
  attention ``12 W L`` per layer for an image of ``L`` patches.

Packed rows are counted at their row length (an upper bound for the attention term of short documents).
Both terms are affine in the length, so :class:`FlopModel` reads the parameter counts once (the training app
builds it at start-up) and each step's count is arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

KDA_CHUNK = 64


def _lm_matrix_params(model: nn.Module) -> float:
    """Parameters a token's forward multiplies by: the decoder stack without the input embedding, routed
    experts scaled by their activation share, and the LM head."""
    lm = model.model
    cfg = lm.config
    total = 0.0
    for name, p in lm.named_parameters():
        if name.startswith("embed_tokens."):
            continue
        routed = ".experts." in name and getattr(cfg, "num_experts", 0)
        total += p.numel() * (cfg.num_experts_per_tok / cfg.num_experts if routed else 1.0)
    return total + model.lm_head.weight.numel()


@dataclass(frozen=True)
class FlopModel:
    """Training FLOPs as ``lm_base + lm_per_seq * seq`` per LM token and ``vision_base + vision_per_len * L``
    per vision patch (images of ``L`` patches)."""

    lm_base: float
    lm_per_seq: float
    vision_base: float = 0.0
    vision_per_len: float = 0.0

    @classmethod
    def of(cls, model: nn.Module) -> FlopModel:
        """From a kimi_vl LM (``.model``, ``.lm_head``; a ``.vision_tower`` when multimodal)."""
        cfg = model.model.config
        lm_base, lm_per_seq = 6.0 * _lm_matrix_params(model), 0.0
        for kind in cfg.layer_types:
            if kind == "full_attention":
                lm_per_seq += 3.0 * cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim)
            else:
                k, c = cfg.linear_head_dim, KDA_CHUNK
                lm_base += 3.0 * cfg.linear_num_heads * (6 * k * k + 3 * c * k + c * c)
        tower = getattr(model, "vision_tower", None)
        if tower is None:
            return cls(lm_base, lm_per_seq)
        params = sum(p.numel() for name, p in tower.named_parameters() if not name.endswith("table"))
        vcfg = tower.config
        return cls(lm_base, lm_per_seq, 6.0 * params, 12.0 * vcfg.hidden_size * vcfg.num_layers)

    def lm_per_token(self, seq: int) -> float:
        return self.lm_base + self.lm_per_seq * seq

    def vision_per_patch(self, image_len: float) -> float:
        return self.vision_base + self.vision_per_len * image_len

    def step(self, seq: int, n_tokens: int, n_patches: int = 0, n_images: int = 0) -> float:
        """A step with ``n_tokens`` LM tokens in rows of ``seq`` and ``n_patches`` vision patches in
        ``n_images`` images or video chunks."""
        flops = self.lm_per_token(seq) * n_tokens
        if n_patches:
            flops += self.vision_per_patch(n_patches / max(n_images, 1)) * n_patches
        return flops


def lm_flops_per_token(model: nn.Module, seq: int) -> float:
    """Training FLOPs per language-model token (``model``: a kimi_vl LM with ``.model`` and ``.lm_head``)."""
    return FlopModel.of(model).lm_per_token(seq)
