"""RL on the suite's ``debug`` flavor beats both its starting checkpoint and the best constant answer (issue 10).

Task family: letter counting (``"a:abba="`` -> ``2``, four-letter words over ``ab``, one answer token), whose answer
depends on the prompt. The run starts from a fresh seeded debug model (``model.backend: kimi_vl``, ``flavor:
debug``, text only) with the shipped ``debug_rl.yaml`` objective (K2.5 loss, alpha/beta/tau as shipped, AdamW lr
3e-3), 16 prompts x K = 8 samples per step, 24 steps. The baseline a policy that ignores the word can reach is the
best single constant answer on the same held-out prompts under the same reward (computed in the test: "1", 0.592 on
the 64 held-out prompts of seed 0; its pass@1 is the share of words with that count).

The model is tiny, so torch's thread pool costs more than it saves: the run uses one thread (measured on the shared
2-core box at load ~9: 2 steps 42 s with 2 threads vs 3.5 s with 1).
"""

from pathlib import Path

import pytest
import torch

from kimi_vl.runconfig import load_config
from rl.config import RLRunConfig
from rl.rewards import compute_reward
from rl.trainer import RLTrainer

CONFIGS = Path(__file__).resolve().parents[2] / "kimi_vl" / "configs"
RUN = ["data.source=letter_count", "data.alphabet=ab0123456789:=", "data.letters=ab", "data.min_len=4",
       "data.max_len=4", "rollout.sampling.max_new_tokens=1", "rollout.eval_sampling.max_new_tokens=1",
       "model.vision_flavor=null", "cpu=true", "seed=0", "max_steps=24", "eval_every=24",
       "data.heldout_prompts=64", "rollout.prompts_per_step=16", "rollout.k=8", "optim.lr=0.003"]


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def best_constant(trainer: RLTrainer) -> tuple[str, float, float]:
    """The single answer (``0``..``9``) with the highest mean held-out reward: (answer, reward, pass@1)."""
    def score(answer: str) -> tuple[float, float]:
        rewards = [compute_reward(p.family, answer, p.answer).reward for p in trainer.heldout]
        return sum(rewards) / len(rewards), sum(r >= 1.0 for r in rewards) / len(rewards)

    answer = max((str(d) for d in range(10)), key=lambda a: score(a)[0])
    return answer, *score(answer)


def test_debug_flavor_rl_beats_start_and_constant_answer(tmp_path, one_thread):
    trainer = RLTrainer(load_config(RLRunConfig, CONFIGS / "debug_rl.yaml", [f"output_dir={tmp_path}", *RUN]))
    assert trainer.cfg.model.backend == "kimi_vl" and trainer.cfg.model.flavor == "debug"
    answer, const_reward, const_pass = best_constant(trainer)
    records = trainer.train()
    before, after = records[0]["eval/reward"], records[-1]["eval/reward"]
    summary = (f"held-out reward {before:.3f} -> {after:.3f}, pass@1 {records[-1]['eval/pass@1']:.3f}; best constant "
               f"{answer!r}: reward {const_reward:.3f}, pass@1 {const_pass:.3f}")
    # measured (seed 0): 0.115 -> 0.882 reward, pass@1 0.797; constant '1': 0.592, pass@1 0.250 (seeds 1-3 clear
    # their own best constant by 0.29, 0.34 and 0.22: rl/README.md)
    assert after > before + 0.5, summary
    assert after > const_reward + 0.15, summary
    assert records[-1]["eval/pass@1"] > const_pass + 0.3, summary
    assert records[-1]["unparsed_share"] < records[1]["unparsed_share"], summary
