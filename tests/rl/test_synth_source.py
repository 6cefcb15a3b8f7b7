"""RL prompts from the synthetic world: chat rendering, media blocks, category rewards, and the whole vision /
text RL path through the trainer (a fresh debug model; learning itself is in test_vision_rl_learns.py)."""

from pathlib import Path

import pytest

from data_pipelines.synth.tasks import eval_items
from data_pipelines.tokenizer import load_tokenizer, special_ids
from kimi_vl.logs import read_metrics
from kimi_vl.runconfig import load_config
from rl.build import load_policy, tokenizer_path
from rl.config import RLRunConfig
from rl.rewards import compute_reward
from rl.synth_source import CATEGORY_REWARDS, PromptBuilder, SynthPromptSource, ground_truth
from rl.trainer import RLTrainer, run_rl
from vision_encoder.geometry import PatchGeometry, tokens_for_grid
from vision_encoder.processor import MoonViTProcessor, MoonViTProcessorConfig

CONFIGS = Path(__file__).resolve().parents[2] / "kimi_vl" / "configs"
SMALL = ["rollout.prompts_per_step=2", "rollout.k=2", "data.heldout_prompts=2", "max_steps=1", "eval_every=1",
         "checkpoint_every=1", "kl_to_init=false", "rollout.sampling.max_new_tokens=3",
         "rollout.eval_sampling.max_new_tokens=3"]


def _builder(root, max_patches=64):
    geo = PatchGeometry(max_patches=max_patches)
    tok = load_tokenizer(root / "tokenizer")
    return tok, PromptBuilder(tok, MoonViTProcessor(MoonViTProcessorConfig(image_geometry=geo, video_geometry=geo)),
                              geo)


def test_prompt_is_the_chat_template_with_expanded_media(rl_data):
    tok, builder = _builder(rl_data)
    ids = special_ids(tok)
    items = eval_items(str(rl_data), "vision")[:6] + eval_items(str(rl_data), "text")[:2]
    for item in items:
        prompt = builder.build(item)
        text = tok.apply_chat_template(item.messages(), tokenize=False, add_generation_prompt=True)
        assert text.endswith("<|im_assistant|>assistant<|im_middle|>")
        collapsed = [t for i, t in enumerate(prompt.input_ids)
                     if not (t == ids.media_pad and i and prompt.input_ids[i - 1] == ids.media_pad)]
        assert collapsed == tok(text, add_special_tokens=False)["input_ids"], item.id
        n_pad = prompt.input_ids.count(ids.media_pad)
        if item.images:
            grid = prompt.media["image_grid_thw"]
            assert n_pad == sum(tokens_for_grid(*g, PatchGeometry(max_patches=64)) for g in grid.tolist()) > 0
            assert prompt.media["pixel_values"].shape[1:] == (3, 14, 14)
        else:
            assert n_pad == 0 and prompt.media == {}
        assert prompt.family == item.category and prompt.family in CATEGORY_REWARDS


@pytest.mark.parametrize("category,answer,answer_type,response,reward", [
    ("count", "3", "int", "3", 1.0),
    ("count", "4", "int", "2", 0.5),
    ("count", "3", "int", "three shapes", 0.0),
    ("color", "red", "str", "Red", 1.0),
    ("spatial", "yes", "yesno", "no", 0.0),
    ("arithmetic", "-4", "int", "-4", 1.0),
    ("chart_value", "40", "int", "30", 0.75),
    ("chart_value", "apples", "str", "apples", 1.0),
    ("ocr", "hello", "str", "hallo", 0.8),
    ("grounding", "[0, 0, 100, 100]", "box", "[0, 0, 100, 100]", 1.0),
    ("grounding", "[0, 0, 100, 100]", "box", "[0, 0, 50, 100]", 2 * 0.5 / 2),
    ("motion", "left", "str", "left", 1.0),
])
def test_category_rewards_score_sft_formatted_answers(category, answer, answer_type, response, reward):
    from data_pipelines.synth.tasks import TaskItem

    gt = ground_truth(TaskItem("x#0", "vision", "shapes", category, "q", answer, answer_type))
    assert compute_reward(category, response, gt).reward == pytest.approx(reward)


def test_source_filters_families_and_categories(rl_data):
    _, builder = _builder(rl_data)
    src = SynthPromptSource(str(rl_data), builder, "vision", ["shapes"], ["count"])
    assert src.families == ["count"] and all(it.family == "shapes" for it in src.pool)
    held = src.heldout(100)
    assert held and all(p.family == "count" and "pixel_values" in p.media for p in held)
    train_ids = {it.id.split("#")[0] for it in src.pool}
    assert not train_ids & {p.uid.split("#")[0] for p in held}, "held-out prompts must come from the eval split"
    with pytest.raises(ValueError, match="text arm needs data.source=text"):
        SynthPromptSource(str(rl_data), builder, "vision", ["text_mirror"])
    with pytest.raises(ValueError, match="unknown QA categories"):
        SynthPromptSource(str(rl_data), builder, "vision", ["shapes"], ["counting"])


def _cfg(rl_data, out, *overrides):
    return load_config(RLRunConfig, CONFIGS / "debug_rl.yaml",
                       [f"output_dir={out}", f"data.path={rl_data}", "cpu=true", *SMALL, *overrides])


def test_vision_rl_path_runs_logs_and_exports(rl_data, tmp_path):
    cfg = _cfg(rl_data, tmp_path / "run", "data.categories=[]", "kl_to_init=true")
    trainer = RLTrainer(cfg)
    prompts = trainer.source.sample(2, trainer.sampler.rng)
    assert all("pixel_values" in p.media for p in prompts)
    records = trainer.train()
    first, last = records[0], records[-1]
    assert "eval/reward" in first and "eval/reward" in last and last["step"] == 1
    assert any(k.startswith("reward/") for k in last) and 0.0 <= last["reward"] <= 1.0
    for key in ("unparsed_share", "masked_share", "entropy", "kl_to_init", "eval/pass@1", "response_len"):
        assert key in last, key
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [0, 1]
    final = tmp_path / "run" / "final"
    assert (final / "tokenizer.json").is_file() and (final / "rl_config.yaml").is_file()
    assert type(load_policy(str(final))).__name__ == "KimiVLForConditionalGeneration"
    # a later stage starts from this export (its own tokenizer is used); run_rl returns the export folder
    cfg2 = _cfg(rl_data, tmp_path / "run", f"init_from={tmp_path / 'run'}")
    assert tokenizer_path(cfg2) == final
    assert run_rl(cfg2) == final  # resumes at step 1 = max_steps: nothing to do but re-export


def test_text_control_arm_runs_without_media(rl_data, tmp_path):
    cfg = _cfg(rl_data, tmp_path, "data.source=text", "data.reward_families=[text_mirror]", "data.categories=[]",
               "model.vision_flavor=null", "max_update_tokens=4", "max_steps=50", "data.heldout_prompts=1")
    trainer = RLTrainer(cfg)
    assert all(p.media == {} for p in trainer.heldout)
    records = trainer.train()
    assert records[-1]["update_tokens"] >= 4 and records[-1]["step"] < 50, "max_update_tokens must stop the run"
    assert "eval/reward" in records[-1]


def test_vision_source_needs_a_vision_tower(rl_data, tmp_path):
    with pytest.raises(ValueError, match="vision tower"):
        RLTrainer(_cfg(rl_data, tmp_path, "model.vision_flavor=null"))
