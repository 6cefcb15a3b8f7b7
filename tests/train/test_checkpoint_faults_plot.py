import json
import os
import signal

import pytest
import torch
from accelerate import Accelerator

from kimi_vl.logs import MetricsWriter
from kimi_vl.train.checkpoint import (
    CheckpointError,
    check_compatible,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
)
from kimi_vl.train.faults import GracefulStop, NonFiniteGuard, NonFiniteLossError
from kimi_vl.train.plot import _trailing_mean, panel_keys, plot_metrics


class Position:
    """A stand-in for the data-loader position registered for checkpointing."""

    def __init__(self):
        self.offset = 0

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, state):
        self.offset = state["offset"]


def make(acc):
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    pos = Position()
    model, opt = acc.prepare(model, opt)
    acc.register_for_checkpointing(pos)
    return model, opt, pos


def step(model, opt):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_round_trip_restores_weights_optimizer_rng_and_position(tmp_path):
    acc = Accelerator(cpu=True)
    model, opt, pos = make(acc)
    step(model, opt)
    pos.offset = 17
    save_checkpoint(acc, tmp_path, 1, {"tokens": 123}, keep_last=2)
    ref_w = model.weight.detach().clone()
    step(model, opt)  # consumes RNG and moves weights/optimizer
    after_one = (model.weight.detach().clone(), torch.randn(3))

    acc2 = Accelerator(cpu=True)
    model2, opt2, pos2 = make(acc2)
    state = load_checkpoint(acc2, latest_checkpoint(tmp_path))
    assert state["step"] == 1 and state["tokens"] == 123 and pos2.offset == 17
    assert torch.equal(model2.weight, ref_w)
    step(model2, opt2)
    assert torch.equal(model2.weight, after_one[0]), "resumed step must be bit-identical"
    assert torch.equal(torch.randn(3), after_one[1]), "RNG state must be restored"


def test_keep_last_and_tmp_leftovers(tmp_path):
    acc = Accelerator(cpu=True)
    model, opt, _ = make(acc)
    for s in (1, 2, 3):
        save_checkpoint(acc, tmp_path, s, {}, keep_last=2)
    (tmp_path / "checkpoints" / "step_00000004.tmp").mkdir()  # a crash mid-write
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["step_00000002", "step_00000003"]
    assert resolve_resume("auto", tmp_path).name == "step_00000003"
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000003"
    assert resolve_resume("never", tmp_path) is None
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        resolve_resume(str(tmp_path), tmp_path)


def test_incompatible_architecture_names_fields():
    with pytest.raises(CheckpointError, match="hidden_size: checkpoint=64 run=128"):
        check_compatible({"hidden_size": 64, "layers": 2}, {"hidden_size": 128, "layers": 2}, "x")
    check_compatible({"a": 1}, {"a": 1}, "x")


def test_graceful_stop_records_sigterm():
    with GracefulStop() as stop:
        assert stop.requested is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested == "SIGTERM"


def test_non_finite_guard_names_step_and_last_metrics():
    guard = NonFiniteGuard()
    guard.check(1, 2.0, {"loss": 2.0, "lr": 0.1})
    with pytest.raises(NonFiniteLossError, match=r"nan at step 2.*step 1.*'lr': 0.1"):
        guard.check(2, float("nan"), {"loss": float("nan")})


def test_plot_writes_png(tmp_path):
    w = MetricsWriter(tmp_path)
    for s in range(5):
        w.log(s, {"loss": 3 - s * 0.1, "loss/text": 3.0, "lr": 0.1, "qk/max_logit": 5.0 + s})
    out = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "c.png")
    assert out.stat().st_size > 5000
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["step"] == 0


def test_plot_panels_split_eval_losses_from_rl_rewards():
    """An RL run's held-out rewards get their own panel (not the held-out loss one), with its KL, entropy and step
    times; a pretraining run's held-out losses stay in theirs."""
    rl = [
        {"step": 0, "eval/reward": 0.1, "eval/pass@1": 0.0, "eval/response_len": 2.0},
        {
            "step": 1,
            "reward": 0.2,
            "kl_to_init": 0.1,
            "entropy": 3.0,
            "time_rollout_s": 0.2,
            "time_update_s": 1.8,
            "gen_tokens_per_s": 900.0,
            "loss": -0.1,
        },
    ]
    panels = panel_keys(rl)
    assert "held-out loss" not in panels
    assert panels["held-out reward (RL)"] == ["eval/pass@1", "eval/reward"]
    assert panels["KL to the initial policy, entropy"] == ["entropy", "kl_to_init"]
    assert panels["RL step seconds"] == ["time_rollout_s", "time_update_s"]
    pre = [{"step": 5, "eval/text/loss": 2.0, "eval/vision/loss": 2.5, "loss": 2.2, "tokens_per_s": 1e4}]
    panels = panel_keys(pre)
    assert panels["held-out loss"] == ["eval/text/loss", "eval/vision/loss"]
    assert "held-out reward (RL)" not in panels and "generated tokens / s" not in panels


def test_export_with_a_given_state_dict_round_trips(tmp_path):
    """``export_pretrained(state_dict=...)`` (the FSDP2 path: rank 0 writes a gathered full state dict) writes
    those weights, and ``from_pretrained`` loads them back exactly."""
    from kimi_vl import KimiVLConfig, KimiVLForCausalLM
    from kimi_vl.train.checkpoint import export_pretrained

    model = KimiVLForCausalLM(KimiVLConfig.from_flavor("debug"))
    gathered = {k: v.detach().clone() + 1.0 for k, v in model.state_dict().items()}  # differs from the model's own
    out = export_pretrained(model, tmp_path / "final", state_dict=gathered)
    loaded = KimiVLForCausalLM.from_pretrained(out).state_dict()
    assert all(torch.equal(loaded[k], gathered[k]) for k in loaded)


def test_plot_panels_put_per_source_losses_and_per_layer_stats_apart():
    """Per-source losses get their own panel (a trailing mean: one batch holds few documents of a source); per-layer
    QK statistics give way to the aggregate when there are many."""
    rec = {"step": 1, "loss": 2.0, "loss/text": 2.1, "loss/src/chart": 1.9, "loss/src/ocr": 2.2,
           "qk/max_logit": 3.0, "qk/clipped_heads": 0.0}
    rec |= {f"qk/clipped_heads/layers.{i}.attn": 0.0 for i in range(9)}
    panels = panel_keys([rec])
    assert panels["training loss"] == ["loss", "loss/text"]
    assert panels["training loss by data source (mean of 10 steps)"] == ["loss/src/chart", "loss/src/ocr"]
    assert panels["clipped heads"] == ["qk/clipped_heads"]
    assert _trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
