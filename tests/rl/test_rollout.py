"""Rollout log-probs equal recomputed ones (text and image prompts); cached sampling equals uncached."""

import pytest
import torch
from rl_models import EOS, IMAGE_TOKEN, PAD, decode, tiny_text_lm, tiny_vlm

from rl.rollout import Prompt, SamplingConfig, recompute_logprobs, sample_group, sample_tokens, top_p_filter


def _image_prompt() -> Prompt:
    grid = torch.tensor([[1, 4, 4]])  # 16 patches -> 4 merged tokens
    media = {"pixel_values": torch.randn(16, 3, 14, 14), "image_grid_thw": grid}
    return Prompt(input_ids=[5, 6] + [IMAGE_TOKEN] * 4 + [7, 8], family="counting", answer=3, media=media)


def _check_logprobs_match(model, prompt, cfg):
    gen = torch.Generator().manual_seed(1)
    g = sample_group(model, prompt, 4, cfg, [EOS], PAD, decode, gen)
    assert g.response_ids_KT.shape[0] == 4 and g.mask_KT.sum() > 0
    with torch.no_grad():
        recomputed, _ = recompute_logprobs(model, prompt.input_ids, g.response_ids_KT, prompt.media, cfg.temperature)
    err = ((recomputed - g.logprobs_KT) * g.mask_KT).abs().max().item()
    assert err < 1e-5, f"recorded vs recomputed log-probs differ by {err}"
    return g


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_text_logprobs_equal_full_forward(temperature, top_p):
    model = tiny_text_lm()
    cfg = SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=12)
    _check_logprobs_match(model, Prompt(input_ids=[1, 5, 9, 13, 4], family="exact", answer="x"), cfg)


def test_image_logprobs_equal_full_forward():
    _check_logprobs_match(tiny_vlm(), _image_prompt(), SamplingConfig(max_new_tokens=10))


@pytest.mark.parametrize("make", [tiny_text_lm, tiny_vlm])
def test_cached_equals_uncached(make):
    model = make()
    prompt = _image_prompt() if make is tiny_vlm else Prompt(input_ids=[1, 5, 9, 13], family="exact", answer="x")
    groups = []
    for use_cache in (True, False):
        cfg = SamplingConfig(max_new_tokens=10, use_cache=use_cache)
        groups.append(sample_group(model, prompt, 3, cfg, [EOS], PAD, decode, torch.Generator().manual_seed(7)))
    cached, uncached = groups
    assert torch.equal(cached.response_ids_KT, uncached.response_ids_KT)
    torch.testing.assert_close(cached.logprobs_KT, uncached.logprobs_KT, atol=1e-5, rtol=0)


def test_stop_strings_eos_and_padding():
    model = tiny_text_lm()
    # a stop string that is any single letter: every response stops after its first non-EOS token
    letters = [chr(ord("a") + i) for i in range(26)]
    cfg = SamplingConfig(max_new_tokens=8, stop_strings=letters)
    g = sample_group(model, Prompt([1, 3], "exact", "a"), 5, cfg, [EOS], PAD, decode, torch.Generator().manual_seed(0))
    for row in range(5):
        n = int(g.lengths[row])
        assert g.finish[row] in ("stop", "eos") and n >= 1
        assert (g.response_ids_KT[row, n:] == PAD).all() and (g.logprobs_KT[row, n:] == 0).all()
        assert len(g.texts[row]) <= 1


def test_top_p_keeps_the_nucleus():
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(lp, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(lp, 0.01)).sum() == 1
    tok, tok_lp = sample_tokens(torch.log(torch.tensor([[0.0, 1.0, 0.0]]) + 1e-30), SamplingConfig(), None)
    assert tok.item() == 1 and tok_lp.item() == pytest.approx(0.0, abs=1e-6)


def test_banned_tokens_are_never_drawn_and_logprobs_still_match():
    """The media placeholders must never be sampled (a text prompt's update forward would find a placeholder with no
    pixel values); like top-p, the ban restricts the draw, so recorded log-probs still equal recomputed ones."""
    logits = torch.log(torch.tensor([[0.9, 0.05, 0.05]] * 64))
    tok, lp = sample_tokens(logits, SamplingConfig(), torch.Generator().manual_seed(0), torch.tensor([0]))
    assert (tok != 0).all() and torch.allclose(lp, torch.log_softmax(logits, -1).gather(1, tok[:, None])[:, 0])
    model = tiny_text_lm()
    prompt = Prompt(input_ids=[1, 5, 9, 13, 4], family="exact", answer="x")
    free = sample_group(model, prompt, 16, SamplingConfig(max_new_tokens=8), [EOS], PAD, decode,
                        torch.Generator().manual_seed(3))
    common = torch.mode(free.response_ids_KT[free.mask_KT.bool()]).values.item()  # the token drawn most often
    banned = [common, IMAGE_TOKEN]
    g = sample_group(model, prompt, 16, SamplingConfig(max_new_tokens=8), [EOS], PAD, decode,
                     torch.Generator().manual_seed(3), banned_ids=banned)
    drawn = g.response_ids_KT[g.mask_KT.bool()]
    assert drawn.numel() and not torch.isin(drawn, torch.tensor(banned)).any()
    with torch.no_grad():
        recomputed, _ = recompute_logprobs(model, prompt.input_ids, g.response_ids_KT, prompt.media, 1.0)
    assert ((recomputed - g.logprobs_KT) * g.mask_KT).abs().max().item() < 1e-5


def test_ban_applies_before_top_p():
    """With top-p, the nucleus is taken among the allowed tokens: a banned top token that alone reaches ``top_p``
    must not leave nothing to draw (the ban after top-p masked every row's only kept token)."""
    logits = torch.log(torch.tensor([[0.9, 0.06, 0.04]] * 256))
    tok, lp = sample_tokens(logits, SamplingConfig(top_p=0.5), torch.Generator().manual_seed(0), torch.tensor([0]))
    assert (tok == 1).all()  # the nucleus of the allowed [0.6, 0.4] at top_p 0.5 is token 1 alone
    assert torch.allclose(lp, torch.log(torch.tensor(0.06)))  # the log-prob under the unrestricted policy


def test_chat_tokenizer_bans_the_media_placeholders(rl_data):
    from data_pipelines.tokenizer import load_tokenizer, special_ids
    from rl.synth_source import ChatTokenizer

    tok = load_tokenizer(rl_data / "tokenizer")
    ids = special_ids(tok)
    assert ChatTokenizer(tok).banned_ids == [ids.media_pad, ids.video_placeholder]


def _suite_models():
    from kimi_vl import KimiVLConfig, KimiVLForCausalLM
    from kimi_vl.modeling.multimodal import KimiVLForConditionalGeneration, vision_config_dict

    torch.manual_seed(0)
    text = KimiVLForCausalLM(KimiVLConfig.from_flavor("debug", vocab_size=64, pad_token_id=PAD, eos_token_id=EOS))
    cfg = KimiVLConfig.from_flavor("debug", vision_config=vision_config_dict("debug", 500, 501))
    return text.eval(), KimiVLForConditionalGeneration(cfg).eval()


def test_suite_model_text_image_video_logprobs_and_cache():
    text_model, vlm = _suite_models()
    cfg = SamplingConfig(max_new_tokens=5)
    _check_logprobs_match(text_model, Prompt(input_ids=[1, 5, 9, 13, 4], family="exact", answer="x"), cfg)
    media = {
        "pixel_values": torch.randn(24, 3, 14, 14),
        "image_grid_thw": torch.tensor([[1, 4, 6]]),
        "pixel_values_videos": torch.randn(24, 3, 14, 14),
        "video_grid_thw": torch.tensor([[4, 2, 2], [2, 2, 2]]),
    }
    prompt = Prompt(input_ids=[1, 2] + [500] * 6 + [3, 501, 4, 501, 5], family="counting", answer=2, media=media)
    cached = _check_logprobs_match(vlm, prompt, cfg)
    uncached = sample_group(vlm, prompt, 4, SamplingConfig(max_new_tokens=5, use_cache=False), [EOS], PAD, decode,
                            torch.Generator().manual_seed(1))  # fmt: skip
    assert torch.equal(cached.response_ids_KT, uncached.response_ids_KT)
