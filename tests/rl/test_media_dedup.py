"""Shared prompt media in the update (issue 10): a micro-batch encodes each distinct prompt's media once and shares
the embedded prompt among its rows. Log-probs, every parameter's gradient (vision tower included), the statistics
and the reference-model KL equal the per-row path (every row with its own copy of the media) on the suite's debug
VLM, with mixed image sizes, a two-image prompt and a text-only prompt, K > 1 and micro-batches that split a
prompt's rows."""

import copy

import pytest
import torch
from rl_models import EOS, PAD, decode

from rl.config import ObjectiveCfg
from rl.rollout import Prompt, SamplingConfig, batch_media, recompute_logprobs, sample_groups
from rl.step import accumulate_policy_gradient, micro_batches

K = 3
IMAGE, VIDEO = 500, 501


def _vlm():
    from kimi_vl import KimiVLConfig
    from kimi_vl.modeling.multimodal import KimiVLForConditionalGeneration, vision_config_dict

    torch.manual_seed(0)
    cfg = KimiVLConfig.from_flavor("debug", vision_config=vision_config_dict("debug", IMAGE, VIDEO), pad_token_id=PAD)
    return KimiVLForConditionalGeneration(cfg).eval()


class _PerRow(torch.nn.Module):
    """The model's forward only (no ``embed_multimodal``): ``recompute_logprobs`` takes the per-row path, as for
    models that do not splice media themselves. Media placeholders get -1e9 logits (sampling one would need
    pixels in the full-sequence forward); ``_Shared`` applies the same to the shared path."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner = model

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out.logits = out.logits.index_fill(-1, torch.tensor([IMAGE, VIDEO]), -1e9)
        return out


class _Shared(_PerRow):
    def embed_multimodal(self, input_ids, **media):
        return self.inner.embed_multimodal(input_ids, **media)

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()


def _image(h: int, w: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(h * w, 3, 14, 14), "image_grid_thw": torch.tensor([[1, h, w]])}


def _prompts() -> list[Prompt]:
    torch.manual_seed(4)
    specs = [([1, 2], 4, 6, [3]), ([1], 4, 4, [3, 4, 5, 6, 7]), ([8, 9, 10], 2, 6, [3, 4])]
    out = [Prompt(pre + [IMAGE] * (h * w // 4) + post, "counting", 2, _image(h, w)) for pre, h, w, post in specs]
    a, b = _image(4, 4), _image(2, 4)  # two images in one prompt
    two = {key: torch.cat([a[key], b[key]]) for key in a}
    out.append(Prompt([7] + [IMAGE] * 4 + [6] + [IMAGE] * 2 + [5], "counting", 2, two))
    return out + [Prompt([1, 5, 9], "counting", 2)]  # a text-only prompt


def _groups(model):
    cfg = SamplingConfig(temperature=0.8, max_new_tokens=6)
    return sample_groups(_PerRow(model), _prompts(), K, cfg, [EOS], PAD, decode, torch.Generator().manual_seed(1))


def _patches_seen(model) -> list[int]:
    seen: list[int] = []
    model.vision_tower.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    return seen


def test_shared_prompt_logprobs_equal_per_row_and_encode_each_prompt_once():
    model = _vlm()
    groups = _groups(model)
    mb = micro_batches(groups, torch.zeros(len(groups), K), 0, PAD)[0]
    assert len(mb.prompts) == len(groups) and len(mb.row_prompt) == len(groups) * K
    seen = _patches_seen(model)
    with torch.no_grad():
        shared = recompute_logprobs(_Shared(model), mb.prompts, mb.ids_RT, mb.media, 0.8, True, mb.mask_RT, PAD,
                                    row_prompt=mb.row_prompt)  # fmt: skip
        per_row_media = batch_media([mb.media[u] for u in mb.row_prompt], 1)
        per_row = recompute_logprobs(_PerRow(model), mb.row_prompts(), mb.ids_RT, per_row_media, 0.8, True,
                                     mb.mask_RT, PAD)  # fmt: skip
        fallback = recompute_logprobs(_PerRow(model), mb.prompts, mb.ids_RT, mb.media, 0.8, True, mb.mask_RT, PAD,
                                      row_prompt=mb.row_prompt)  # fmt: skip
    unique_patches = sum(m["pixel_values"].shape[0] for m in mb.media if m)
    assert seen == [unique_patches, K * unique_patches, K * unique_patches]  # shared, per row, fallback
    mask = mb.mask_RT.bool()
    for other in (per_row, fallback):
        torch.testing.assert_close(shared[0][mask], other[0][mask], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(shared[1][mask], other[1][mask], atol=1e-5, rtol=1e-4)


def _update(model, ref, groups, adv, rows, shared: bool):
    wrap = _Shared if shared else _PerRow
    model.zero_grad(set_to_none=True)
    stats = accumulate_policy_gradient(wrap(model), groups, adv, ObjectiveCfg(micro_batch_rows=rows), 0.8,
                                       ref_model=wrap(ref), pad_id=PAD)  # fmt: skip
    return stats, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("rows", [0, 2, 4, 5])
def test_update_with_shared_media_equals_per_row_media(rows):
    model = _vlm()
    groups = _groups(model)
    ref = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():  # a reference policy away from the policy: a non-zero KL
        for p in ref.parameters():
            p.add_(0.02 * torch.randn_like(p))
    adv = torch.randn(len(groups), K, generator=torch.Generator().manual_seed(2))
    mbs = micro_batches(groups, adv, rows, PAD)
    if rows in (2, 4, 5):  # some prompt's rows are cut across micro-batches
        owners = [{tuple(p) for p in mb.row_prompts()} for mb in mbs]
        assert any(a & b for i, a in enumerate(owners) for b in owners[i + 1 :])
    model.train()
    ref_stats, ref_grads = _update(model, ref, groups, adv, rows, shared=False)
    stats, grads = _update(model, ref, groups, adv, rows, shared=True)
    assert grads.keys() == ref_grads.keys()
    assert any(n.startswith("vision_tower.") and g.abs().sum() > 0 for n, g in grads.items())
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], atol=1e-5, rtol=1e-4, msg=f"{name}, micro_batch_rows={rows}")
    assert stats.keys() == ref_stats.keys() and ref_stats["kl_to_init"] > 0
    for key, value in ref_stats.items():
        assert stats[key] == pytest.approx(value, abs=1e-5), key


def test_row_prompt_length_is_checked():
    model = _vlm()
    with pytest.raises(ValueError, match="row_prompt"):
        recompute_logprobs(_Shared(model), [[1, 2]], torch.ones(2, 3, dtype=torch.long), [{}], row_prompt=[0])
