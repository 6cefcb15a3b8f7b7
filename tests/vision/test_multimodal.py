"""KimiVLForConditionalGeneration: placeholder splicing, errors, generate, Auto registration, kimi_k25 parity."""

from __future__ import annotations

import pytest
import torch
from kvl_testing import assert_rel_rms

from kimi_vl.configuration import KimiVLConfig
from kimi_vl.modeling.cache import output_cache
from kimi_vl.modeling.multimodal import KimiVLForConditionalGeneration, vision_config_dict

IMG, VID = 500, 501


@pytest.fixture(scope="module")
def model() -> KimiVLForConditionalGeneration:
    torch.manual_seed(0)
    cfg = KimiVLConfig.from_flavor("debug", vision_config=vision_config_dict("debug", IMG, VID))
    return KimiVLForConditionalGeneration(cfg).eval()


def _inputs():
    grid, vgrid = torch.tensor([[1, 4, 6]]), torch.tensor([[4, 2, 2], [2, 2, 2]])
    ids = torch.tensor([[1, 2] + [IMG] * 6 + [3, VID, 4, VID, 5]])
    return ids, torch.randn(24, 3, 14, 14), grid, torch.randn(24, 3, 14, 14), vgrid


def test_placeholders_become_projected_vision_tokens(model) -> None:
    ids, pv, grid, pvv, vgrid = _inputs()
    with torch.no_grad():
        embeds = model.embed_multimodal(ids, pv, grid, pvv, vgrid)
        img = model.vision_tower(pv, grid).projected
        vid = model.vision_tower(pvv, vgrid).projected
        text = model.model.embed_tokens(ids)
    assert_rel_rms(embeds[0, 2:8], img, 1e-5, "image tokens")  # one joint tower call: GEMM rounding only
    assert_rel_rms(embeds[0, [9, 11]], vid, 1e-5, "video tokens")
    keep = (ids != IMG) & (ids != VID)
    assert torch.equal(embeds[keep], text[keep])
    out = model(ids, pixel_values=pv, image_grid_thw=grid, pixel_values_videos=pvv, video_grid_thw=vgrid, labels=ids)
    assert torch.isfinite(out.loss)


def test_images_and_videos_share_one_tower_call(model) -> None:
    ids, pv, grid, pvv, vgrid = _inputs()
    calls = []
    handle = model.vision_tower.register_forward_hook(lambda m, args, out: calls.append(args[1].shape[0]))
    try:
        with torch.no_grad():
            model.embed_multimodal(ids, pv, grid, pvv, vgrid)
            model.embed_multimodal(ids[:, :9], pv, grid)
    finally:
        handle.remove()
    assert calls == [3, 1]  # 1 image + 2 video chunks in one call; an image-only batch alone


def test_count_mismatch_is_a_clear_error(model) -> None:
    ids, pv, grid, pvv, vgrid = _inputs()
    with pytest.raises(ValueError, match="image tokens do not match: input_ids has 5 image placeholders"):
        short = ids[:, torch.arange(ids.shape[1]) != 2]
        model(short, pixel_values=pv, image_grid_thw=grid, pixel_values_videos=pvv, video_grid_thw=vgrid)
    with pytest.raises(ValueError, match="no video pixel values"):
        model(ids, pixel_values=pv, image_grid_thw=grid)


def test_generated_placeholder_token_decodes_as_text(model) -> None:
    """An (untrained) model may sample a placeholder id; a cached decode step must embed it as a token."""
    ids, pv, grid, pvv, vgrid = _inputs()
    with torch.no_grad():
        out = model(ids, pixel_values=pv, image_grid_thw=grid, pixel_values_videos=pvv, video_grid_thw=vgrid,
                    use_cache=True)
        step = model(torch.tensor([[IMG]]), past_key_values=output_cache(out), use_cache=True)
    assert torch.isfinite(step.logits).all()
    with pytest.raises(ValueError, match="no image pixel values"):  # without a cache it is still an error
        model(torch.tensor([[1, IMG]]))


def test_moe_balancing_runs_for_the_multimodal_model(model) -> None:
    ids, pv, grid, pvv, vgrid = _inputs()
    with torch.no_grad():
        model(ids, pixel_values=pv, image_grid_thw=grid, pixel_values_videos=pvv, video_grid_thw=vgrid)
    stats = model.update_moe_bias()
    assert "moe/max_violation" in stats and len(stats) > 1


def test_gradients_reach_the_vision_tower(model) -> None:
    ids, pv, grid, pvv, vgrid = _inputs()
    model.train()
    try:
        out = model(ids, pixel_values=pv, image_grid_thw=grid, pixel_values_videos=pvv, video_grid_thw=vgrid,
                    labels=ids)
        out.loss.backward()
        assert model.vision_tower.patch_embed.weight.grad.abs().sum() > 0
        assert model.vision_tower.projector.fc2.weight.grad.abs().sum() > 0
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


def test_generate_with_image_and_video_matches_full_forward(model) -> None:
    ids, pv, grid, pvv, vgrid = _inputs()
    media = dict(pixel_values=pv, image_grid_thw=grid, pixel_values_videos=pvv, video_grid_thw=vgrid)
    with torch.no_grad():
        gen = model.generate(input_ids=ids, max_new_tokens=3, do_sample=False, **media)
        seq = ids
        for _ in range(3):
            logits = model(seq, use_cache=False, **media).logits
            seq = torch.cat([seq, logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(gen, seq)


def test_auto_class_registration(model, tmp_path) -> None:
    from transformers import AutoModelForImageTextToText

    model.save_pretrained(tmp_path)
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, KimiVLForConditionalGeneration)
    ids, pv, grid, pvv, vgrid = _inputs()
    media = dict(pixel_values=pv, image_grid_thw=grid, pixel_values_videos=pvv, video_grid_thw=vgrid)
    with torch.no_grad():
        # not bit-equal: the reloaded text model may pick another attention implementation (~1e-7 apart)
        assert_rel_rms(loaded(ids, **media).logits, model(ids, **media).logits, 1e-5, "reloaded logits")


def test_full_vlm_parity_with_kimi_k25(tmp_path) -> None:
    k25 = pytest.importorskip("transformers.models.kimi_k25.modeling_kimi_k25")
    from transformers import KimiLinearConfig
    from transformers.models.kimi_k25.configuration_kimi_k25 import Kimi_K25Config, Kimi_K25VisionConfig

    from kimi_vl.convert_vision import convert_from_kimi_k25, state_dict_from_kimi_k25, state_dict_to_kimi_k25

    torch.manual_seed(0)
    text = KimiLinearConfig(
        vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "dense"],
        linear_head_dim=16, linear_num_heads=2, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=8, v_head_dim=16, pad_token_id=1, bos_token_id=0, eos_token_id=0,
        max_position_embeddings=256, tie_word_embeddings=False)
    vision = Kimi_K25VisionConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                  pos_emb_height=8, pos_emb_width=8)
    cfg = Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=32, image_token_id=IMG,
                         video_token_id=VID, tie_word_embeddings=False)
    ref = k25.Kimi_K25ForConditionalGeneration(cfg)
    with torch.no_grad():
        ref.model.vision_tower.patch_embed.pos_emb.position_embeddings.normal_(0, 0.5)
    ref.save_pretrained(tmp_path, save_original_format=False)
    ref = k25.Kimi_K25ForConditionalGeneration.from_pretrained(tmp_path).eval()
    ours = convert_from_kimi_k25(ref).eval()
    # transformers' kimi_k25 splits video features by t*h*w/4 (wrong for t > 1), so its videos here are t = 1
    grid, vgrid = torch.tensor([[1, 4, 6], [1, 2, 2]]), torch.tensor([[1, 2, 4], [1, 2, 4]])
    media = dict(pixel_values=torch.randn(28, 3, 14, 14), image_grid_thw=grid,
                 pixel_values_videos=torch.randn(16, 3, 14, 14), video_grid_thw=vgrid)
    ids = torch.tensor([[1, 2] + [IMG] * 6 + [3, IMG, 4, VID, VID, 7, VID, VID, 9]])
    with torch.no_grad():
        expected = ref(input_ids=ids, **media).logits
        actual = ours(input_ids=ids, **media).logits
    assert_rel_rms(actual, expected, 1e-5, "logits")
    theirs = ref.state_dict()
    back = state_dict_to_kimi_k25(state_dict_from_kimi_k25(theirs))
    assert back.keys() == theirs.keys() and all(torch.equal(back[k], theirs[k]) for k in theirs)


def _scatter_case(device: str, dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(3)
    mask_BL = torch.rand(3, 17, generator=gen) < 0.4
    embeds = torch.randn(3, 17, 8, generator=gen).to(device, dtype).requires_grad_()
    rows = torch.randn(int(mask_BL.sum()), 8, generator=gen).to(device, dtype).requires_grad_()
    return embeds, mask_BL.to(device), rows


def test_scatter_rows_equals_masked_scatter() -> None:
    """The splice's sync-free ``scatter_rows`` gives masked_scatter's values and both gradients, bit for bit."""
    from kimi_vl.modeling.multimodal import scatter_rows

    embeds, mask_BL, rows = _scatter_case("cpu")
    grad_out = torch.randn(embeds.shape, generator=torch.Generator().manual_seed(4))
    got = scatter_rows(embeds, mask_BL, rows)
    want = embeds.masked_scatter(mask_BL[..., None], rows)
    assert torch.equal(got, want)
    g_got = torch.autograd.grad(got, (embeds, rows), grad_out)
    g_want = torch.autograd.grad(want, (embeds, rows), grad_out)
    assert all(torch.equal(a, b) for a, b in zip(g_got, g_want))
    assert torch.equal(g_got[0][mask_BL], torch.zeros_like(rows))  # spliced positions pass no gradient back


@pytest.mark.gpu
def test_scatter_rows_never_synchronises_on_gpu() -> None:
    """Forward and backward of the splice queue work without a host-device synchronisation (the count check is a
    device-side assertion), so a training step's host can run ahead of the GPU."""
    from kimi_vl.modeling.multimodal import _check_slots, scatter_rows

    embeds, mask_BL, rows = _scatter_case("cuda", torch.bfloat16)
    n = rows.shape[0]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _check_slots(mask_BL, n, "image", lambda count: f"count {count}")
        out = scatter_rows(embeds, mask_BL, rows)
        out.float().square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(out, embeds.masked_scatter(mask_BL[..., None], rows))
