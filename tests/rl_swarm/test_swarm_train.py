"""Orchestrator training plumbing on the debug model: the model policy's recorded log-probs are the trainer's,
transcripts train only assistant tokens, and one PARL step runs the K2.5 objective and moves the weights."""

from __future__ import annotations

import pytest
import torch

from rl.config import ObjectiveCfg
from rl.rollout import SamplingConfig, recompute_logprobs
from rl.step import accumulate_policy_gradient
from rl.swarm.envs import make_wide_task
from rl.swarm.parl import AnnealSchedule, PARLConfig
from rl.swarm.policies import ModelPolicy
from rl.swarm.runtime import RuntimeConfig, SwarmRuntime
from rl.swarm.train import (
    SwarmRLCfg,
    _turn_groups,
    build_model,
    build_tokenizer,
    rl_step,
    run_episodes,
    scripted_episodes,
    sft_example,
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=512, n_transcripts=24)


@pytest.fixture(scope="module")
def model(tok):
    return build_model(tok, "debug", seed=0).eval()


def test_tool_markers_are_single_tokens(tok) -> None:
    ids = tok.encode("<|tool_calls_section_begin|><|tool_call_begin|>", add_special_tokens=False)
    assert len(ids) == 2


def test_sft_labels_cover_assistant_turns_only(tok) -> None:
    ep = scripted_episodes(1, 4, 1.0, 2, seed=0)[0]
    ids, labels = sft_example(ep, tok)
    trained = tok.decode([i for i, lab in zip(ids, labels) if lab != -100], skip_special_tokens=False)
    assert "functions.create_subagent" in trained and "Answer:" in trained
    assert "Scenes 0 to" not in trained and "Tools:" not in trained  # the user question and the system prompt


def test_model_policy_logprobs_match_recompute_and_never_crash(model, tok) -> None:
    policy = ModelPolicy(model, tok, SamplingConfig(max_new_tokens=12), seed=3)
    vocab = tok.get_vocab()  # the media placeholders are never drawn
    assert policy.banned_ids == [vocab["<|media_pad|>"], vocab["<|kimi_k25_video_placeholder|>"]]
    ep = SwarmRuntime(policy, lambda m: "Answer: 1", RuntimeConfig(max_orchestrator_steps=3)).run(make_wide_task(0, 4))
    assert len(policy.turns) == len(ep.stages) >= 1
    t = policy.turns[0]
    with torch.no_grad():
        logp, _ = recompute_logprobs(model, t.prompt_ids, t.response_ids[None], {})
    torch.testing.assert_close(logp[0], t.logprobs, atol=2e-4, rtol=0)


def test_rl_step_updates_the_orchestrator(model, tok) -> None:
    import copy

    m = copy.deepcopy(model)
    policy = ModelPolicy(m, tok, SamplingConfig(max_new_tokens=8), seed=0)
    cfg = SwarmRLCfg(tasks_per_step=1, k=3, n_scenes=2, runtime=RuntimeConfig(max_orchestrator_steps=2),
                     parl=PARLConfig(AnnealSchedule(0.5), AnnealSchedule(0.3)))  # fmt: skip
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    log = rl_step(m, policy, opt, cfg, step=0, seed=0)
    for key in ("reward", "r_parallel", "r_finish", "outcome", "serial_collapse", "loss", "lambda1", "masked_share"):
        assert key in log
    assert log["lambda1"] == 0.5


def test_turn_rows_carry_their_episode_advantage(model, tok) -> None:
    policy = ModelPolicy(model, tok, SamplingConfig(max_new_tokens=6), seed=1)
    rollouts = run_episodes(policy, lambda m: "Answer: 1", RuntimeConfig(max_orchestrator_steps=2),
                            [make_wide_task(0, 2)], k=2)  # fmt: skip
    n0, n1 = (len(turns) for _, turns in rollouts[0])
    groups, adv = _turn_groups(rollouts, torch.tensor([[1.0, -1.0]]))
    assert len(groups) == n0 + n1 and adv[:, 0].tolist() == [1.0] * n0 + [-1.0] * n1
    model.zero_grad(set_to_none=True)
    accumulate_policy_gradient(model, groups, adv, ObjectiveCfg(), 1.0, pad_id=policy.pad_id)
    g_adv = sum(p.grad.abs().sum().item() for p in model.parameters() if p.grad is not None)
    assert g_adv > 0
    model.zero_grad(set_to_none=True)
    accumulate_policy_gradient(model, groups, torch.zeros_like(adv), ObjectiveCfg(), 1.0, pad_id=policy.pad_id)
    g_zero = sum(p.grad.abs().sum().item() for p in model.parameters() if p.grad is not None)
    assert g_zero < 1e-2 * g_adv  # A = 0 and rho ~ 1: only the (tiny) squared log-ratio penalty is left
    model.zero_grad(set_to_none=True)


def test_rl_step_without_signal_leaves_weights_unchanged(model, tok) -> None:
    """All rewards equal (a random model never answers right nor spawns agents): advantages are 0 and AdamW, which
    already holds momentum from an earlier step, must not move the weights."""
    import copy

    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0)
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # momentum that a plain opt.step() would keep applying
    before = [p.detach().clone() for p in m.parameters()]
    policy = ModelPolicy(m, tok, SamplingConfig(max_new_tokens=8), seed=0)
    cfg = SwarmRLCfg(tasks_per_step=1, k=2, n_scenes=2, runtime=RuntimeConfig(max_orchestrator_steps=1),
                     parl=PARLConfig(AnnealSchedule(0.0), AnnealSchedule(0.0)))  # fmt: skip
    log = rl_step(m, policy, opt, cfg, step=0, seed=0)
    assert log["reward"] == 0.0
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
    assert log["skipped_update"] == 1.0


def test_warm_start_lr_schedule() -> None:
    from rl.swarm.train import WarmStartCfg

    lin = WarmStartCfg(steps=4, lr=1.0)
    assert [lin.lr_at(t) for t in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert WarmStartCfg(steps=4, lr=1.0, lr_schedule="constant").lr_at(3) == 1.0
    with pytest.raises(ValueError, match="lr_schedule"):
        WarmStartCfg(lr_schedule="cosine").lr_at(0)  # type: ignore[arg-type]
