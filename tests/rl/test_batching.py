"""Mixed-length batching: prompts of different lengths (text and images) sampled in one left-padded batch give the
log-probs of per-prompt forwards, the same tokens as per-prompt batches under (near-)greedy sampling, cached ==
uncached; the update's micro-batches of mixed prompt lengths give the per-row gradients."""

import pytest
import torch
from rl_models import EOS, IMAGE_TOKEN, PAD, decode, tiny_text_lm, tiny_vlm

from data_pipelines.packing import left_pad
from rl.config import ObjectiveCfg
from rl.rollout import Prompt, SamplingConfig, prompt_batches, recompute_logprobs, sample_groups
from rl.step import accumulate_policy_gradient, micro_batches

K = 3


def _text_prompts() -> list[Prompt]:
    rows = [[1, 5, 9, 13, 4], [3, 4], [7, 8, 9, 10, 11, 12, 13, 5], [6, 6]]
    return [Prompt(input_ids=r, family="exact", answer="x", uid=str(i)) for i, r in enumerate(rows)]


def _image(h: int, w: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(h * w, 3, 14, 14), "image_grid_thw": torch.tensor([[1, h, w]])}


def _image_prompts() -> list[Prompt]:
    torch.manual_seed(3)
    specs = [([5, 6], 4, 4, [7, 8]), ([5], 4, 8, [7, 8, 9, 10, 11]), ([9, 9, 9], 4, 4, [7])]
    out = [Prompt(pre + [IMAGE_TOKEN] * (h * w // 4) + post, "counting", 3, _image(h, w)) for pre, h, w, post in specs]
    return out + [Prompt([3, 4, 5], "counting", 3)]  # a text-only prompt in the same batch


class _NoMediaTokens(torch.nn.Module):
    """The tiny VLM with its image / video placeholder ids never sampled (a sampled placeholder would need pixels in
    the full-sequence forward): their logits get -1e9, for the sampler and the recomputation alike."""

    def __init__(self, model: torch.nn.Module, media_ids: list[int]):
        super().__init__()
        self.inner, self.media_ids = model, media_ids

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out.logits = out.logits.index_fill(-1, torch.tensor(self.media_ids), -1e9)
        return out


def _vlm():
    return _NoMediaTokens(tiny_vlm(), [IMAGE_TOKEN, IMAGE_TOKEN + 1]).eval()


def _suite_vlm():
    from kimi_vl import KimiVLConfig
    from kimi_vl.modeling.multimodal import KimiVLForConditionalGeneration, vision_config_dict

    torch.manual_seed(0)
    cfg = KimiVLConfig.from_flavor("debug", vision_config=vision_config_dict("debug", 500, 501), pad_token_id=PAD)
    return _NoMediaTokens(KimiVLForConditionalGeneration(cfg), [500, 501]).eval()


def _suite_image_prompts() -> list[Prompt]:
    torch.manual_seed(4)
    specs = [([1, 2], 4, 6, [3]), ([1], 4, 4, [3, 4, 5, 6, 7]), ([8, 9, 10], 4, 6, [3, 4])]
    out = [Prompt(pre + [500] * (h * w // 4) + post, "counting", 2, _image(h, w)) for pre, h, w, post in specs]
    return out + [Prompt([1, 5, 9], "counting", 2)]


def _suite_text_model():
    from kimi_vl import KimiVLConfig, KimiVLForCausalLM

    torch.manual_seed(0)
    cfg = KimiVLConfig.from_flavor("debug", vocab_size=64, pad_token_id=PAD, eos_token_id=EOS)
    return KimiVLForCausalLM(cfg).eval()


CASES = {"text": (tiny_text_lm, _text_prompts), "image": (_vlm, _image_prompts),
         "suite": (_suite_text_model, _text_prompts), "suite_image": (_suite_vlm, _suite_image_prompts)}  # fmt: skip


def _sample(model, prompts, cfg, seed=1):
    return sample_groups(model, prompts, K, cfg, [EOS], PAD, decode, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_logprobs_equal_per_prompt_forward(case):
    make, prompts_fn = CASES[case]
    model, prompts = make(), prompts_fn()
    cfg = SamplingConfig(temperature=0.8, max_new_tokens=8)
    for g, p in zip(_sample(model, prompts, cfg), prompts):
        assert g.prompt is p and g.mask_KT.sum() > 0
        with torch.no_grad():  # one prompt, no padding: the reference forward
            ref, _ = recompute_logprobs(model, p.input_ids, g.response_ids_KT, p.media, cfg.temperature)
        err = ((ref - g.logprobs_KT) * g.mask_KT).abs().max().item()
        assert err < 1e-5, f"prompt {p.input_ids}: batched rollout log-probs vs per-prompt forward differ by {err}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_batching_does_not_change_greedy_samples(case):
    # top_p -> 0 keeps only the argmax: the tokens depend on the model's outputs, not on the random numbers
    make, prompts_fn = CASES[case]
    model, prompts = make(), prompts_fn()
    runs = [_sample(model, prompts, SamplingConfig(top_p=1e-6, max_new_tokens=8, max_rows=rows)) for rows in (0, K)]
    for one_batch, per_prompt in zip(*runs):
        assert torch.equal(one_batch.response_ids_KT, per_prompt.response_ids_KT)
        torch.testing.assert_close(one_batch.logprobs_KT, per_prompt.logprobs_KT, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["text", "image"])
def test_mixed_batch_cached_equals_uncached_and_is_seeded(case):
    make, prompts_fn = CASES[case]
    model, prompts = make(), prompts_fn()
    cached = _sample(model, prompts, SamplingConfig(max_new_tokens=6, max_rows=2 * K))
    again = _sample(model, prompts, SamplingConfig(max_new_tokens=6, max_rows=2 * K))
    uncached = _sample(model, prompts, SamplingConfig(max_new_tokens=6, max_rows=2 * K, use_cache=False))
    for a, b, c in zip(cached, again, uncached):
        assert torch.equal(a.response_ids_KT, b.response_ids_KT) and torch.equal(a.logprobs_KT, b.logprobs_KT)
        assert torch.equal(a.response_ids_KT, c.response_ids_KT)
        torch.testing.assert_close(a.logprobs_KT, c.logprobs_KT, atol=1e-5, rtol=0)


def test_prompt_batches_and_left_pad():
    assert prompt_batches([5, 2, 8, 2], 3, 0) == [[1, 3, 0, 2]]
    assert prompt_batches([5, 2, 8, 2], 3, 6) == [[1, 3], [0, 2]]
    assert prompt_batches([5, 2, 8], 3, 2) == [[1], [0], [2]]  # a prompt's K rows are never split
    with pytest.raises(ValueError, match="max_rows"):
        prompt_batches([1], 1, -1)
    ids, mask = left_pad([[4, 5, 6], [7]], PAD)
    assert ids.tolist() == [[4, 5, 6], [PAD, PAD, 7]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert left_pad([[1, 2], [3, 4]], PAD)[1] is None
    with pytest.raises(ValueError, match="non-empty"):
        left_pad([[1], []], PAD)


def _grads(model, groups, adv, rows):
    model.zero_grad(set_to_none=True)
    stats = accumulate_policy_gradient(model, groups, adv, ObjectiveCfg(micro_batch_rows=rows), 0.8, pad_id=PAD)
    return stats, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_micro_batches_equal_per_row_gradients(case):
    make, prompts_fn = CASES[case]
    model, prompts = make(), prompts_fn()
    groups = _sample(model, prompts, SamplingConfig(temperature=0.8, max_new_tokens=6))
    adv = torch.randn(len(groups), K)
    assert len({g.response_ids_KT.shape[1] for g in groups} | {len(p.input_ids) for p in prompts}) > 2
    model.train()
    ref_stats, ref = _grads(model, groups, adv, 1)  # every row alone: no padding anywhere
    for rows in (0, 5):
        stats, grads = _grads(model, groups, adv, rows)
        assert grads.keys() == ref.keys() and len(grads) > 0
        for name, g in grads.items():
            torch.testing.assert_close(g, ref[name], atol=1e-5, rtol=1e-4, msg=f"{name}, micro_batch_rows={rows}")
        for key in ("loss", "masked_share", "entropy"):
            assert stats[key] == pytest.approx(ref_stats[key], abs=1e-5), key


def test_micro_batches_cover_every_response_token_once():
    model, prompts = tiny_text_lm(), _text_prompts()
    groups = _sample(model, prompts, SamplingConfig(max_new_tokens=6))
    mbs = micro_batches(groups, torch.zeros(len(groups), K), 5, PAD)
    assert all(mb.ids_RT.shape[0] <= 5 for mb in mbs)
    assert sum(float(mb.mask_RT.sum()) for mb in mbs) == sum(float(g.mask_KT.sum()) for g in groups)
    assert sorted(tuple(p) for mb in mbs for p in mb.row_prompts()) == sorted(
        tuple(p.input_ids) for p in prompts for _ in range(K)
    )
