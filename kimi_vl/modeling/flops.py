"""Model FLOPs of one training step (forward + backward = 3x forward), the numerator of MFU.

One formula for the backbone benchmark and the training app, so that their MFU numbers compare:

- language model, per token of a length-``seq`` row: ``6 x`` the matrix parameters a token passes through
  (everything but the input embedding; routed experts counted at ``k / E``; the LM head included), plus the
  sequence-mixing term per layer: causal MLA ``3 H (d_qk + d_v) seq`` (half of the ``seq^2`` pairs), KDA's
  chunked form ``3 H (6 K^2 + 3 C K + C^2)`` with chunk ``C = 64`` (independent of ``seq``);
- vision tower, per patch: ``6 x`` its parameters (the position table excluded: a lookup), plus non-causal
  attention ``12 W L`` per layer for an image of ``L`` patches.

Packed rows are counted at their row length (an upper bound for the attention term of short documents).
"""

from __future__ import annotations

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


def lm_flops_per_token(model: nn.Module, seq: int) -> float:
    """Training FLOPs per language-model token (``model``: a kimi_vl LM with ``.model`` and ``.lm_head``)."""
    cfg = model.model.config
    flops = 6.0 * _lm_matrix_params(model)
    for kind in cfg.layer_types:
        if kind == "full_attention":
            flops += 3.0 * cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim) * seq
        else:
            k, c = cfg.linear_head_dim, KDA_CHUNK
            flops += 3.0 * cfg.linear_num_heads * (6 * k * k + 3 * c * k + c * c)
    return flops


def vision_flops_per_patch(tower: nn.Module, image_len: float) -> float:
    """Training FLOPs per patch of the vision tower for images of ``image_len`` patches on average."""
    params = sum(p.numel() for name, p in tower.named_parameters() if not name.endswith("table"))
    cfg = tower.config
    return 6.0 * params + 12.0 * cfg.hidden_size * image_len * cfg.num_layers


def step_flops(model: nn.Module, seq: int, n_tokens: int, n_patches: int = 0, n_images: int = 0) -> float:
    """Training FLOPs of a step with ``n_tokens`` LM tokens in rows of ``seq`` and ``n_patches`` vision
    patches in ``n_images`` images or video chunks."""
    flops = lm_flops_per_token(model, seq) * n_tokens
    tower = getattr(model, "vision_tower", None)
    if tower is not None and n_patches:
        flops += vision_flops_per_patch(tower, n_patches / max(n_images, 1)) * n_patches
    return flops
