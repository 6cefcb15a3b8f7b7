"""MoE routing/balancing and the MLA module (QK-Clip protocol, absorbed latent decode)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from backbone_utils import build, step_under_env, tiny_config
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device

from kimi_vl.modeling.attention import MLAttention
from kimi_vl.modeling.cache import MLALayerCache
from kimi_vl.modeling.masks import build_mask
from kimi_vl.modeling.moe import MoE


def _moe(**kw) -> MoE:
    torch.manual_seed(0)
    moe = MoE(tiny_config(**kw))
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return moe


def test_moe_equals_per_token_reference():
    moe = _moe()
    x = torch.randn(3, 7, 32)
    _, w, idx = moe.gate(x.reshape(-1, 32))
    ref = []
    for n, xn in enumerate(x.reshape(-1, 32)):
        y = moe.shared_experts(xn)
        for j in range(w.shape[1]):
            e = int(idx[n, j])
            h = F.silu(moe.experts.gate_proj[e] @ xn) * (moe.experts.up_proj[e] @ xn)
            y = y + w[n, j] * (moe.experts.down_proj[e] @ h)
        ref.append(y)
    assert_rel_rms(moe(x).reshape(-1, 32), torch.stack(ref), 1e-6, "moe")


def test_router_weights_are_renormalised_and_bias_only_changes_choice():
    moe = _moe()
    x = torch.randn(50, 32)
    _, w, idx = moe.gate(x)
    assert torch.allclose(w.sum(-1), torch.full((50,), 1.7), atol=1e-5)  # routed_scaling_factor
    moe.gate.e_score_correction_bias[3] = 10.0
    _, w2, idx2 = moe.gate(x)
    assert (idx2 == 3).any(-1).all()
    scores = torch.sigmoid(x @ moe.gate.weight.T)
    chosen = scores.gather(1, idx2)
    assert torch.allclose(w2, chosen / chosen.sum(-1, keepdim=True) * 1.7, atol=1e-6)


def test_aux_loss_free_bias_moves_towards_balance_outside_the_gradient():
    moe = _moe().train()
    moe.gate.e_score_correction_bias[0] = 1.0  # expert 0 overloaded
    x = torch.randn(4, 16, 32)
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[:, 12:] = 0
    moe(x, mask).sum().backward()
    assert moe.gate.tokens_per_expert.sum() == 4 * 12 * 2  # padding is not counted
    assert moe.gate.e_score_correction_bias.grad is None
    stats = moe.gate.update_bias(0.01)
    assert stats["max_violation"] > 0
    assert moe.gate.e_score_correction_bias[0] == pytest.approx(0.99)
    assert moe.gate.tokens_per_expert.sum() == 0


def test_model_update_moe_bias_reports_every_moe_layer():
    model = build(tiny_config()).train()
    ids = torch.randint(3, 97, (2, 20))
    model(ids, labels=ids, use_cache=False).loss.backward()
    stats = model.update_moe_bias()
    assert set(stats) == {"moe/layer1/max_violation", "moe/layer2/max_violation", "moe/max_violation"}


def _mla(**kw) -> MLAttention:
    torch.manual_seed(0)
    attn = MLAttention(tiny_config(**kw), layer_idx=1)
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return attn


def _head_logits(attn: MLAttention, x: torch.Tensor) -> torch.Tensor:
    q, ckv, krope = attn._project(x)
    k, _ = attn._expand(ckv, krope)
    return torch.einsum("bthd,bshd->bhts", q, k) * attn.scaling


@pytest.mark.parametrize("q_lora_rank", [None, 12])
def test_qk_clip_scales_each_heads_logits_by_gamma(q_lora_rank):
    attn = _mla(q_lora_rank=q_lora_rank)
    x = torch.randn(1, 9, 32)
    before = _head_logits(attn, x)
    untouched = {n: p.clone() for n, p in attn.named_parameters()}
    attn.qk_clip_(torch.tensor([1.0, 0.25]))
    after = _head_logits(attn, x)
    assert torch.equal(after[:, 0], before[:, 0])
    assert torch.allclose(after[:, 1], 0.25 * before[:, 1], atol=1e-6)
    for name in ("kv_a_proj_with_mqa.weight", "o_proj.weight", "kv_a_layernorm.weight"):
        assert torch.equal(untouched[name], dict(attn.named_parameters())[name]), name
    v_rows = attn.kv_b_proj.weight.view(2, 16, -1)[:, 8:]
    assert torch.equal(v_rows, untouched["kv_b_proj.weight"].view(2, 16, -1)[:, 8:])


def test_track_max_logits_matches_visible_pairs_only():
    pytest.importorskip("kernels.qk_max")
    attn = _mla().train()
    attn.track_max_logits = True
    x = torch.randn(2, 10, 32)
    mask_BS = torch.ones(2, 10, dtype=torch.long)
    mask_BS[1, :3] = 0
    attn(x, build_mask(10, 10, mask_BS, None, x.device, use_flex=False))
    logits = _head_logits(attn, x).detach()
    visible = torch.ones(10, 10, dtype=torch.bool).tril()[None, None] & mask_BS.bool()[:, None, None, :]
    expected = logits.masked_fill(~visible, -math.inf).amax(dim=(0, 2, 3))
    assert torch.allclose(attn.max_logits_H, expected, atol=1e-5)


def test_absorbed_latent_decode_equals_expanded():
    attn = _mla().eval()
    x = torch.randn(2, 12, 32)
    outs = {}
    with torch.no_grad():
        for mode in ("latent", "expanded"):
            cache = MLALayerCache(mode=mode)
            attn(x[:, :8], build_mask(8, 8, None, None, x.device, False), cache)
            outs[mode] = attn(x[:, 8:], build_mask(4, 12, None, None, x.device, False), cache)
    assert_rel_rms(outs["latent"], outs["expanded"], 1e-6, "absorbed vs expanded")


def test_flex_block_mask_equals_dense_packed_mask():
    from torch.nn.attention.flex_attention import flex_attention

    cu = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
    flex = build_mask(20, 20, None, cu, torch.device("cpu"), use_flex=True)
    dense = build_mask(20, 20, None, cu, torch.device("cpu"), use_flex=False)
    q, k, v = torch.randn(1, 2, 20, 12), torch.randn(1, 2, 20, 12), torch.randn(1, 2, 20, 8)
    got = flex_attention(q, k, v, block_mask=flex.block_mask, scale=0.3)  # eager here; compiled on CUDA
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense.dense_B1TS, scale=0.3)
    assert_rel_rms(got, ref, 1e-5, "flex vs dense")


def test_mla_keys_through_the_triton_expand_equal_pytorch(monkeypatch):
    """The model with MLA's key expansion through ``kernels.mla_expand``'s kernels (interpreter on a CPU) gives the
    PyTorch form's logits and every parameter's gradient (fp32: the kernels copy, and sum k_rope's gradient over
    heads in fp32)."""
    interpret_without_gpu(monkeypatch)
    dev = kernel_device()
    model = build(tiny_config(moe=False)).to(dev).train()
    ids = torch.randint(3, 97, (2, 11), device=dev)
    runs = step_under_env(model, ids, monkeypatch, "KVL_MLA_EXPAND_BACKEND", ("torch", "triton"))
    assert torch.equal(runs["triton"][0], runs["torch"][0])
    assert runs["triton"][1].keys() == runs["torch"][1].keys()
    for name, g in runs["torch"][1].items():
        assert_rel_rms(runs["triton"][1][name], g, 1e-6, name)
