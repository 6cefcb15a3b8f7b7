"""``kimi-vl train`` / ``accelerate launch -m kimi_vl.train`` and ``kimi-vl configs``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kimi_vl.train.config import CONFIG_DIR, TrainConfig, list_run_configs, load_run_config


def parse_args(argv: Sequence[str], prog: str) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog=prog, description="Train a stage (pretrain or sft) from a YAML run config.",
        epilog="Overrides: key=value with dotted keys, e.g. optim.lr=3e-4 data.path=DIR max_steps=100.")
    parser.add_argument("--config", required=True, help=f"a YAML file or the name of a shipped config ({CONFIG_DIR})")
    parser.add_argument("--dry-run", action="store_true",
                        help="build the model and print the resolved config and the optimizer routing, then exit")
    parser.add_argument("overrides", nargs="*", help="key=value overrides applied after the file")
    return parser.parse_args(argv), []


def main(argv: Sequence[str] | None = None, prog: str = "kimi-vl train") -> int:
    import sys

    from kimi_vl.train.build import check_inputs

    args, _ = parse_args(sys.argv[1:] if argv is None else argv, prog)
    cfg = load_run_config(TrainConfig, args.config, args.overrides, check_inputs, prog)
    if cfg is None:
        return 2
    if args.dry_run:
        return dry_run(cfg)
    from kimi_vl.train.checkpoint import CheckpointError
    from kimi_vl.train.loop import Trainer

    try:
        trainer = Trainer(cfg)
        out = trainer.run()
    except CheckpointError as exc:  # init_from or resume names a checkpoint this run cannot load (fields named)
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    trainer.close()
    if trainer.interrupted:
        print(f"[train] stopped by {trainer.interrupted}; checkpoint {out}")
        return 143
    print(f"[train] done: {out}")
    return 0


def dry_run(cfg: TrainConfig) -> int:
    """Print the resolved config and where every parameter goes (Muon or AdamW), without training."""
    import yaml

    from kimi_vl.optim import routing_summary
    from kimi_vl.runconfig import to_dict
    from kimi_vl.train.build import build_model, build_tokenizer

    print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    model = build_model(cfg, build_tokenizer(cfg))
    print(routing_summary(model, cfg.optim))
    return 0


def configs_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="kimi-vl configs", description="list the shipped run configs")
    parser.parse_args(argv)
    for path in list_run_configs():
        print(f"{path.stem:<28} {path}")
    return 0
