"""``kimi-vl eval``: local tasks only, lm-eval-like output, per-question samples for the ablation harness."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_lm_eval_model import TASKS, write_tasks

from eval.ablation.collect import read_samples
from eval.cli import main
from kimi_vl.cli import COMMANDS


def test_eval_cli_writes_results_and_samples(ckpt, tmp_path, capsys):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    write_tasks(tasks)
    out = tmp_path / "out"
    # the README's form: the batch size in --model_args, samples into the not yet existing output folder
    rc = main(["--model_args", f"checkpoint={ckpt},device=cpu,batch_size=4", "--tasks", ",".join(TASKS),
               "--include_path", str(tasks), "--bootstrap_iters", "0", "--samples_out", str(out / "s.json"),
               "--output_path", str(out)])
    assert rc == 0 and "tiny_mc" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    samples = read_samples(out / "s.json")
    assert set(samples) == set(TASKS)
    mc = samples["tiny_mc"]
    assert mc["metric"] == "acc" and mc["higher_is_better"] and len(mc["num"]) == 4
    assert mc["aggregate"] == pytest.approx(results["results"]["tiny_mc"]["acc,none"])
    ppl = samples["tiny_ppl"]
    assert ppl["metric"] == "bits_per_byte" and not ppl["higher_is_better"] and len(ppl["den"]) == 2
    assert ppl["aggregate"] == pytest.approx(results["results"]["tiny_ppl"]["bits_per_byte,none"], rel=1e-6)
    assert math.isfinite(ppl["aggregate"]) and ppl["aggregate"] > 0


def test_two_batch_sizes_are_a_usage_error(ckpt, tmp_path, capsys):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    write_tasks(tasks)
    with pytest.raises(SystemExit) as err:
        main(["--model_args", f"checkpoint={ckpt},batch_size=4", "--batch_size", "2", "--tasks", next(iter(TASKS)),
              "--include_path", str(tasks)])
    assert err.value.code == 2 and "both set the batch size" in capsys.readouterr().err


def test_cuda_device_without_cuda_falls_back_to_the_cpu(ckpt, monkeypatch):
    """lm-eval's own CLI passes device='cuda' by default; on a CPU machine the model runs there with a warning."""
    from eval.lm_eval_model import KimiVLLM

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # (a machine without CUDA, wherever this runs)
    with pytest.warns(UserWarning, match="CUDA is not available"):
        lm = KimiVLLM(checkpoint=str(ckpt), device="cuda")
    assert lm.device.type == "cpu"


def test_commands_are_registered():
    assert COMMANDS["eval"][1] == "eval.cli:main" and COMMANDS["ablate"][1] == "eval.ablation.cli:main"


def test_device_defaults_to_the_cpu_without_cuda(monkeypatch):
    """Without ``--device`` the evaluation runs on cuda when there is one, else on the CPU (lm-eval's ``hf`` model
    would take cuda and stop); ``--device`` wins, ``device=`` in ``--model_args`` is passed once, both is an error."""
    from eval.cli import EvalInputError, _device, build_parser

    def parse(*argv):
        return build_parser().parse_args(["--tasks", "t", *argv])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _device(parse()) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _device(parse()) == "cuda"
    assert _device(parse("--device", "cpu")) == "cpu"
    assert _device(parse("--model_args", "pretrained=x,device=cpu")) is None
    with pytest.raises(EvalInputError, match="both set the device"):
        _device(parse("--model_args", "device=cpu", "--device", "cpu"))
