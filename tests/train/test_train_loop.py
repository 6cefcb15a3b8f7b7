"""The training app end to end on the CPU: golden losses, resume, SIGTERM, NaN, bad input."""

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch

from kimi_vl.logs import read_metrics
from kimi_vl.runconfig import ConfigError, load_config
from kimi_vl.train.checkpoint import CheckpointError, list_checkpoints
from kimi_vl.train.cli import main as train_cli
from kimi_vl.train.config import TrainConfig
from kimi_vl.train.faults import NonFiniteLossError
from kimi_vl.train.loop import Trainer, train

GOLDEN = Path(__file__).with_name("golden_debug_pretrain.json")
FAST = ["data.seq_len=128", "data.batch_size=2", "data.max_patches=64", "eval_batches=1"]


def config(tiny_data, out, *overrides):
    return load_config(TrainConfig, "kimi_vl/configs/debug_pretrain.yaml",
                       [f"data.path={tiny_data}", f"output_dir={out}", *FAST, *overrides])


def losses(out):
    return [r["loss"] for r in read_metrics(Path(out) / "metrics.jsonl")]


def test_golden_20_steps(tiny_data, tmp_path):
    """Per-step losses of the debug flavor on the tiny preset match the committed golden file.

    One torch thread, whatever the runner uses: the reduction order of multi-threaded CPU kernels moves the
    losses by ~0.5% after 20 steps. Regenerate on purpose only (KVL_REGEN_GOLDEN=1), with the reason in
    the commit message.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        final = train(config(tiny_data, tmp_path / "run", "max_steps=20"))
    finally:
        torch.set_num_threads(threads)
    got = losses(tmp_path / "run")
    assert len(got) == 20 and all(math.isfinite(x) for x in got)
    if os.environ.get("KVL_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps({"losses": got}, indent=1) + "\n")
    want = json.loads(GOLDEN.read_text())["losses"]
    assert got == pytest.approx(want, rel=2e-4), "training trajectory changed"
    assert sum(got[-5:]) / 5 < sum(got[:5]) / 5 - 0.4, "20 steps must reduce the loss"
    assert (final / "config.json").is_file() and (final / "tokenizer.json").is_file()
    from transformers import AutoModelForImageTextToText

    import kimi_vl  # noqa: F401  (registers the Auto classes)

    model = AutoModelForImageTextToText.from_pretrained(final)
    assert type(model).__name__ == "KimiVLForConditionalGeneration"


def test_sigterm_checkpoints_and_resume_matches_uninterrupted(tiny_data, tmp_path, monkeypatch):
    full = tmp_path / "full"
    train(config(tiny_data, full, "max_steps=5"))
    part = tmp_path / "part"
    original = Trainer.queue_step

    def step_then_sigterm(self, batches):
        queued = original(self, batches)
        if self.step == 2:  # during step 3: the loop must finish it, checkpoint and stop
            os.kill(os.getpid(), signal.SIGTERM)
        return queued

    monkeypatch.setattr(Trainer, "queue_step", step_then_sigterm)
    stopped = train(config(tiny_data, part, "max_steps=5"))
    assert stopped.name == "step_00000003" and not (part / "final").exists()
    monkeypatch.setattr(Trainer, "queue_step", original)
    train(config(tiny_data, part, "max_steps=5"))  # resume=auto
    assert losses(part) == losses(full), "resumed run must follow the uninterrupted trajectory exactly"
    from safetensors.torch import load_file

    wa, wb = load_file(full / "final" / "model.safetensors"), load_file(part / "final" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_deferred_metrics_equal_immediate(tiny_data, tmp_path):
    """defer_metrics only moves when a step's values are read: every logged value but the timings is identical,
    and so are the final weights (a step with an eval, at 3, is read at once in the middle of deferred ones)."""
    from safetensors.torch import load_file

    runs = {}
    for defer in (False, True):
        out = tmp_path / f"defer_{defer}"
        train(config(tiny_data, out, "max_steps=5", "eval_every=3", f"defer_metrics={str(defer).lower()}"))
        runs[defer] = (read_metrics(out / "metrics.jsonl"), load_file(out / "final" / "model.safetensors"))
    timing = {"time", "step_time_s", "tokens_per_s", "mfu", "gc_s", "data_wait_s"}
    (rows_a, w_a), (rows_b, w_b) = runs[False], runs[True]
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b] == [1, 2, 3, 4, 5]
    for a, b in zip(rows_a, rows_b):
        assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
    assert "eval/loss" in rows_b[2] and "qk/max_logit" in rows_b[0] and "grad_norm" in rows_b[0]
    assert all(torch.equal(w_a[k], w_b[k]) for k in w_a)


def test_a_failing_step_keeps_the_deferred_row(tiny_data, tmp_path, monkeypatch):
    """Step 2's metrics wait for step 3 to be queued (defer_metrics); when queueing step 3 fails, step 2's row is
    still written before the error propagates."""
    original = Trainer.queue_step

    def failing(self, batches):
        if self.step == 2:
            raise RuntimeError("simulated failure in step 3")
        return original(self, batches)

    monkeypatch.setattr(Trainer, "queue_step", failing)
    with pytest.raises(RuntimeError, match="simulated failure"):
        train(config(tiny_data, tmp_path / "r", "max_steps=5"))
    assert [r["step"] for r in read_metrics(tmp_path / "r" / "metrics.jsonl")] == [1, 2]


@pytest.mark.parametrize("bad_step", [3, 4])
def test_nan_loss_stops_and_keeps_last_good_checkpoint(tiny_data, tmp_path, monkeypatch, bad_step):
    """Step 3's metrics are read after step 4 is queued (defer_metrics), step 4's at once (a checkpoint step):
    either way the run stops naming the bad step, before step 4's checkpoint."""
    original = Trainer.queue_step

    def poisoned(self, batches):
        queued = original(self, batches)
        if self.step == bad_step - 1:
            queued.losses = torch.full_like(queued.losses, float("nan"))
        return queued

    monkeypatch.setattr(Trainer, "queue_step", poisoned)
    with pytest.raises(NonFiniteLossError, match=f"at step {bad_step}"):
        train(config(tiny_data, tmp_path / "r", "max_steps=6", "checkpoint_every=2"))
    assert [p.name for p in list_checkpoints(tmp_path / "r")] == ["step_00000002"]


def test_bad_inputs_are_named(tiny_data, tmp_path, capsys):
    with pytest.raises(ConfigError, match="optim.lrr"):
        config(tiny_data, tmp_path, "optim.lrr=1")
    assert train_cli(["--config", "debug_pretrain", "bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        Trainer(load_config(TrainConfig, "kimi_vl/configs/debug_pretrain.yaml",
                            [f"data.path={empty}", f"output_dir={tmp_path / 'x'}"]))
    with pytest.raises(ValueError, match="vision_ratio"):
        config(tiny_data, tmp_path, "data.vision_ratio=1.5")
    # the CLI checks the input paths before building anything: one line naming the field, exit code 2
    for override, message in ((f"data.path={empty}", "no manifest.json"),
                              (f"data.tokenizer={empty / 'tok'}", "data.tokenizer="),
                              (f"init_from={tmp_path / 'run'}", "init_from="),
                              ("data.path=synth:nosuch", "expected synth:PRESET[:SEED]"),
                              ("data.path=synth:tiny:x", "expected synth:PRESET[:SEED]")):
        assert train_cli(["--config", "debug_pretrain", f"data.path={tiny_data}", override]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_incompatible_init_from_is_refused(tiny_data, tmp_path, capsys):
    """The differing fields are named; the CLI prints them as one usage error (exit 2, no traceback) and leaves no
    output folder behind."""
    final = train(config(tiny_data, tmp_path / "a", "max_steps=1"))
    with pytest.raises(CheckpointError, match="hidden_size"):
        Trainer(config(tiny_data, tmp_path / "b", "max_steps=1", f"init_from={final}",
                       "model.overrides={hidden_size: 96}"))
    capsys.readouterr()
    assert train_cli(["--config", "debug_pretrain", f"data.path={tiny_data}", f"output_dir={tmp_path / 'c'}",
                      *FAST, "max_steps=1", f"init_from={final}", "model.overrides={hidden_size: 96}"]) == 2
    err = capsys.readouterr().err
    assert "incompatible architecture" in err and "hidden_size" in err and "Traceback" not in err
    assert not (tmp_path / "c" / "config.yaml").exists()


def test_resume_checks_the_architecture_and_notes_new_batch_settings(tiny_data, tmp_path, capsys):
    out = tmp_path / "run"
    train(config(tiny_data, out, "max_steps=2", "checkpoint_every=2"))
    with pytest.raises(CheckpointError, match=r"(?s)step_00000002 \(resume\).*hidden_size: checkpoint=64 run=96"):
        Trainer(config(tiny_data, out, "max_steps=3", "model.overrides={hidden_size: 96}")).run()
    capsys.readouterr()
    train(config(tiny_data, out, "max_steps=3", "data.batch_size=3"))
    printed = capsys.readouterr().out
    assert "resumed from" in printed and "data.batch_size 2 -> 3" in printed and "seq_len" not in printed


def test_compile_vision_matches_eager(tiny_data, tmp_path):
    """``compile_vision``: the MoonViT blocks compiled (dynamic shapes) train like eager, without a recompile per
    batch; the option is refused where it cannot work."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    media = ["max_steps=3", "data.seq_len=512", "data.vision_ratio=0.5"]  # images in every step
    train(config(tiny_data, tmp_path / "eager", *media))
    train(config(tiny_data, tmp_path / "compiled", *media, "compile_vision=true"))
    assert losses(tmp_path / "compiled") == pytest.approx(losses(tmp_path / "eager"), rel=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert not torch._dynamo.utils.counters["recompiles"], "a new batch shape recompiled the blocks"
    with pytest.raises(ValueError, match="compile_vision"):
        config(tiny_data, tmp_path / "x", "max_steps=1", "compile=true", "compile_vision=true")


def test_cpu_threads_setting(monkeypatch) -> None:
    from kimi_vl.train.loop import set_cpu_threads

    before = torch.get_num_threads()
    try:
        assert set_cpu_threads(2, on_gpu=False) == 2
        assert set_cpu_threads(0, on_gpu=False) == 2  # auto on CPU keeps torch's setting
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert set_cpu_threads(0, on_gpu=True) == 1  # auto on a GPU: one thread
        torch.set_num_threads(2)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert set_cpu_threads(0, on_gpu=True) == 2  # the user's OMP_NUM_THREADS wins
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="cpu_threads"):
        TrainConfig(output_dir="x", max_steps=1, cpu_threads=-1)


def test_scheduled_gc(tiny_data, tmp_path):
    """``gc_every``: automatic collection is off while training, a timed full collection runs after every N-th step
    (``gc_s`` in its metrics), and the collector is restored afterwards; with 0, full collections are still timed."""
    import gc

    from kimi_vl.train.pygc import ScheduledGC

    seen = []

    class Probe(Trainer):
        def queue_step(self, batches):
            seen.append(gc.isenabled())
            return super().queue_step(batches)

    assert gc.isenabled()
    Probe(config(tiny_data, tmp_path / "run", "max_steps=4", "gc_every=2")).run()
    assert seen == [False] * 4 and gc.isenabled()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if "gc_s" in r] == [2, 4]
    with ScheduledGC(0) as pygc:  # 0: Python's automatic collection, nothing scheduled, full collections still timed
        assert gc.isenabled()
        gc.collect()  # stands in for an automatic full collection during a step
        spent = pygc.after_step(50)
        assert spent is not None and spent > 0
        assert pygc.after_step(51) is None  # nothing since the last call
    assert pygc._on_gc not in gc.callbacks
    with pytest.raises(ValueError, match="gc_every"):
        TrainConfig(output_dir="x", max_steps=1, gc_every=-1)
