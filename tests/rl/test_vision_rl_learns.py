"""Vision RL raises held-out reward on one synthetic family: counting shapes in images.

The starting checkpoint comes from the training app (``kimi_vl.train.loop.train`` with ``debug_sft.yaml``: a short
image-text SFT of a fresh debug model on the test slice of the synthetic world), then ``debug_rl.yaml`` runs RL on
the train split's "how many ... are in the image?" questions and evaluates on the eval split's. Slow (minutes on a
busy 2-core CPU): the fast tests in test_synth_source.py cover the vision path, rewards and metrics.

Measured (seed 0, 258 s on the shared 2-core CPU at load ~6): held-out reward 0.593 -> 0.787 (pass@1 0.556 ->
0.722) after 6 and after 12 steps; with the batched rollouts (session 3) 0.537 -> 0.787 at 2 torch threads, the count
the test pins: at 1 thread (an xdist worker) the SFT start differs in float rounding and started at 0.648.
Caveat: 13 of the 18 held-out answers are 1, and always answering "1" scores
exactly 0.787, so this run shows RL raising held-out reward, not that the debug model learned to count from pixels.
"""

from pathlib import Path

import pytest
import torch

from kimi_vl.runconfig import load_config
from kimi_vl.train.config import TrainConfig
from kimi_vl.train.loop import train
from rl.config import RLRunConfig
from rl.trainer import RLTrainer

CONFIGS = Path(__file__).resolve().parents[2] / "kimi_vl" / "configs"
SFT = ["data.sft_preset=image_text", "data.vision_ratio=0.8", "data.seq_len=128", "data.batch_size=4",
       "data.max_patches=64", "max_steps=40", "eval_batches=1", "checkpoint_every=0"]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_vision_rl_raises_heldout_counting_reward(rl_data, tmp_path):
    run_learning(rl_data, tmp_path)


def run_learning(rl_data, tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the SFT checkpoint's float sums depend on the thread count (xdist workers run 1)
    try:
        _learn(rl_data, tmp_path)
    finally:
        torch.set_num_threads(threads)


def _learn(rl_data, tmp_path):
    sft = train(load_config(TrainConfig, CONFIGS / "debug_sft.yaml",
                            [f"data.path={rl_data}", f"output_dir={tmp_path / 'sft'}", *SFT]))
    cfg = load_config(RLRunConfig, CONFIGS / "debug_rl.yaml",
                      [f"output_dir={tmp_path / 'rl'}", f"data.path={rl_data}", f"init_from={sft}", "cpu=true",
                       "max_steps=12", "eval_every=6", "data.heldout_prompts=64", "rollout.prompts_per_step=4"])
    records = RLTrainer(cfg).train()
    before, after = records[0]["eval/reward"], records[-1]["eval/reward"]
    assert after > before + 0.15, f"held-out counting reward {before:.3f} -> {after:.3f}"
    assert records[-1]["unparsed_share"] <= records[1]["unparsed_share"]
