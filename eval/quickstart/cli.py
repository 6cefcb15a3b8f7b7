"""``kimi-vl quickstart [--out DIR] [--ci]``."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path

from eval.quickstart.pipeline import Pipeline, QuickstartConfig
from eval.quickstart.report import summary_lines

# A reduced run for CI: same stages, fewer steps and questions.
CI_SIZES = {"pretrain_steps": 30, "sft_steps": 10, "rl_steps": 3, "eval_limit": 3, "suite_samples": 3,
            "overrides": {"pretrain": ["eval_every=10", "checkpoint_every=0"], "sft": ["eval_every=5"]}}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kimi-vl quickstart",
        description="data -> pretrain -> zero-vision SFT -> vision RL -> eval after each -> demo -> report (CPU, "
                    "minutes). Re-running continues where it stopped.")
    parser.add_argument("--out", default="quickstart", help="folder for every artefact (default ./quickstart)")
    parser.add_argument("--ci", action="store_true", help="reduced sizes for CI (same stages)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    cfg = QuickstartConfig(out=Path(args.out), seed=args.seed, **(CI_SIZES if args.ci else {}))
    try:
        report = Pipeline(cfg).run()
    except KeyboardInterrupt:
        again = shlex.join(["kimi-vl", "quickstart", *argv])
        print(f"\nkimi-vl quickstart: interrupted. Finished stages are kept under {cfg.out}; run `{again}` "
              "again to go on from the stage that stopped (a training stage resumes from its last checkpoint).")
        return 130
    print("\n".join(["", "=" * 72, "kimi-vl quickstart: done", *summary_lines(cfg.out), f"report: {report}",
                     "=" * 72]))
    return 0
