import json
import subprocess
import sys

from kimi_vl.cli import COMMANDS, main
from kimi_vl.logs import MetricsWriter, read_metrics


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_unknown_command(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_env_json(capsys):
    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("torch", "triton", "transformers", "accelerate", "lm-eval", "devices", "kernels"):
        assert key in report


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "kimi_vl.cli", "env"], capture_output=True, text=True, check=True)
    assert "transformers" in out.stdout


def test_metrics_writer_jsonl(tmp_path):
    w = MetricsWriter(tmp_path)
    w.log(1, {"loss": 2.5, "nan": float("nan")})
    w.log(2, {"loss": 2.0})
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2] and recs[1]["loss"] == 2.0 and recs[0]["nan"] == "nan"
