"""The ``kimi-vl`` command.

Each subcommand is a ``main(argv) -> int`` function in the module that owns it, listed once in
:data:`COMMANDS` and imported only when it runs (so ``kimi-vl --help`` stays fast). A subcommand
parses its own arguments; run configs go through :mod:`kimi_vl.runconfig`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# name -> (one-line help, "module:function")
COMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": ("the whole pipeline on a CPU in minutes (data, pretrain, SFT, RL, eval, demo, report)",
                   "eval.quickstart.cli:main"),
    "env": ("print versions, devices and how the kernels will run here", "kimi_vl.cli:cmd_env"),
    "convert": ("convert transformers kimi_linear <-> kimi_vl checkpoints", "kimi_vl.convert:main"),
    "data": ("build (synth), inspect and tokenize datasets", "data_pipelines.cli:main"),
    "train": ("train a stage (pretrain / sft) from a YAML run config", "kimi_vl.train.cli:main"),
    "configs": ("list the shipped run configs with their paths", "kimi_vl.train.cli:configs_main"),
    "plot": ("draw a run's curves (loss, max logits, throughput) to PNG", "kimi_vl.train.plot:main"),
    "eval": ("run lm-eval tasks on a checkpoint with the kimi_vl model (local task suites)", "eval.cli:main"),
    "rl": ("vision RL with verifiable rewards (K2.5 objective) from a YAML run config", "rl.trainer:main"),
    "swarm": ("agent-swarm experiment (single agent vs orchestrator + sub-agents, PARL)", "rl.swarm.experiment:main"),
    "ablate": ("run an ablation experiment (arms x seeds) and write its report with CIs", "eval.ablation.cli:main"),
    "demo": ("page demos with a checkpoint: video2web, screenshot2web, heldout", "eval.demo.cli:main"),
}


def cmd_env(argv: Sequence[str]) -> int:
    import argparse
    import json

    from kimi_vl.envinfo import env_report, format_report

    parser = argparse.ArgumentParser(prog="kimi-vl env", description=COMMANDS["env"][0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = env_report()
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: kimi-vl COMMAND [ARGS...]", "", "Kimi K2.5 recipe at research scale.", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (help_, _) in COMMANDS.items()]
    lines += ["", "Run 'kimi-vl COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"kimi-vl: unknown command '{name}'\n\n{usage()}", file=sys.stderr)
        return 2
    module, func = COMMANDS[name][1].split(":")
    handler = getattr(importlib.import_module(module), func)
    return int(handler(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
