"""``kimi-vl eval`` / ``python -m eval``: lm-eval with the ``kimi_vl`` model registered and local tasks.

lm-eval's own CLI cannot discover an external model and indexes its ~15k bundled tasks on every start, so this
entry point imports the model (which registers ``kimi_vl``), builds
``TaskManager(include_path=..., include_defaults=False)`` and calls ``lm_eval.simple_evaluate``. Options follow
lm-eval's CLI names::

    kimi-vl eval --model_args checkpoint=runs/x/final --tasks kimi_text --include_path eval/tasks/out
    kimi-vl eval --model hf --model_args pretrained=runs/x/final --tasks arc_easy --include_defaults

``--include_defaults`` also indexes lm-eval's bundled tasks (needed for MMLU-Pro, GPQA, ARC, ...).
``--samples_out FILE`` writes per-question scores for the ablation harness (``eval.ablation.collect``).
``kimi-vl eval lm-eval ARGS...`` hands ARGS to lm-eval's own CLI (every option it has) after registering the model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kimi-vl eval", description="run lm-eval tasks on a kimi_vl (or hf) checkpoint")
    p.add_argument("--model", default="kimi_vl", help="lm-eval model name (kimi_vl, hf, ...)")
    p.add_argument("--model_args", default="", help="comma-separated key=value, e.g. checkpoint=DIR,batch_size=8")
    p.add_argument("--tasks", required=True, help="comma-separated task or group names")
    p.add_argument("--include_path", action="append", default=[], help="directory of task YAML (repeatable)")
    p.add_argument("--include_defaults", action="store_true", help="also index lm-eval's bundled tasks")
    p.add_argument("--num_fewshot", type=int, default=None)
    p.add_argument("--batch_size", default=None, help="requests per forward (default 8; or batch_size= in "
                   "--model_args, not both)")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu, ... (default: cuda when there is one, else cpu; "
                   "or device= in --model_args, not both)")
    p.add_argument("--limit", type=float, default=None, help="max docs per task (a fraction if < 1)")
    p.add_argument("--gen_kwargs", default=None, help="e.g. temperature=0,max_gen_toks=64")
    p.add_argument("--apply_chat_template", action="store_true")
    p.add_argument("--use_cache", default=None, help="sqlite cache path for model responses")
    p.add_argument("--bootstrap_iters", type=int, default=1000, help="lm-eval's own stderr bootstrap (0 = off)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--output_path", default=None, help="write lm-eval's results JSON here (file or directory)")
    p.add_argument("--log_samples", action="store_true", help="keep per-sample outputs in --output_path")
    p.add_argument("--samples_out", default=None, help="write per-question scores (samples.json) for ablations")
    p.add_argument("--metric", action="append", default=[], help="TASK=METRIC analysed in --samples_out")
    return p


def register() -> None:
    """Import what registers models: ``kimi_vl`` with transformers and ``kimi_vl`` with lm-eval."""
    import eval.lm_eval_model  # noqa: F401
    import kimi_vl  # noqa: F401


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate and return lm-eval's results dict (with ``samples`` when per-sample output was asked for)."""
    register()
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    include = [str(Path(p).resolve()) for p in args.include_path]
    for p in include:
        if not Path(p).is_dir():
            raise EvalInputError(f"--include_path {p}: not a directory")
    tm = TaskManager(include_path=include or None, include_defaults=args.include_defaults or not include)
    check_tasks(args.tasks.split(","), tm.all_tasks, include)
    batch, device = _batch_size(args), _device(args)
    return simple_evaluate(
        model=args.model, model_args=args.model_args, tasks=args.tasks.split(","), num_fewshot=args.num_fewshot,
        batch_size=batch, device=device, limit=args.limit, gen_kwargs=args.gen_kwargs,
        apply_chat_template=args.apply_chat_template, use_cache=args.use_cache, bootstrap_iters=args.bootstrap_iters,
        log_samples=bool(args.log_samples or args.samples_out), task_manager=tm, random_seed=args.seed,
        numpy_random_seed=args.seed, torch_random_seed=args.seed, fewshot_random_seed=args.seed,
    )


class EvalInputError(ValueError):
    """An input lm-eval would fail on (a task folder that is not one, an unknown task name), named before the model
    loads; ``kimi-vl eval`` prints it as a usage error."""


def _set_in_model_args(args: argparse.Namespace, key: str, what: str) -> bool:
    """Whether ``--model_args`` sets ``key`` (lm-eval would then pass the model two values if the flag did too: that
    is an :class:`EvalInputError`)."""
    in_model_args = key in _model_args(args)
    if in_model_args and getattr(args, key) is not None:
        raise EvalInputError(f"--{key} and --model_args {key}=... both set the {what}; keep one")
    return in_model_args


def _batch_size(args: argparse.Namespace) -> int | str | None:
    """``--batch_size``, or ``None`` when ``--model_args`` sets it, else 8."""
    if _set_in_model_args(args, "batch_size", "batch size"):
        return None
    size = "8" if args.batch_size is None else str(args.batch_size)
    return int(size) if size.isdigit() else size


def _device(args: argparse.Namespace) -> str | None:
    """``--device``, or ``None`` when ``--model_args`` sets it, else ``cuda`` when there is one and ``cpu`` otherwise
    (lm-eval's ``hf`` model takes cuda for an unset device and stops on a machine without it)."""
    if _set_in_model_args(args, "device", "device"):
        return None
    if args.device is not None:
        return args.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _model_args(args: argparse.Namespace) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args.model_args.split(",") if "=" in a)


def check_tasks(tasks: Sequence[str], known: Sequence[str], include: Sequence[str]) -> None:
    """Raise :class:`EvalInputError` naming each unknown task with the closest known names."""
    import difflib

    unknown = [t for t in tasks if t not in known and not Path(t).is_file()]
    if unknown:
        hints = "; ".join(f"{t!r}: did you mean {difflib.get_close_matches(t, known, n=3) or 'none close'}"
                          for t in unknown)
        where = f" in {', '.join(include)}" if include else " (lm-eval's own tasks; add --include_path DIR for yours)"
        raise EvalInputError(f"--tasks: unknown {hints}; {len(known)} tasks known{where}")


def _write_outputs(results: dict, args: argparse.Namespace) -> None:
    from lm_eval.utils import handle_non_serializable

    if args.samples_out:
        from eval.ablation.collect import samples_from_lm_eval, write_samples

        metrics = dict(m.split("=", 1) for m in args.metric)
        write_samples(args.samples_out, samples_from_lm_eval(results, metrics))
    if args.output_path:
        out = Path(args.output_path)
        if out.suffix != ".json":
            out.mkdir(parents=True, exist_ok=True)
            out = out / "results.json"
        keep = results if args.log_samples else {k: v for k, v in results.items() if k != "samples"}
        out.write_text(json.dumps(keep, indent=1, default=handle_non_serializable, ensure_ascii=False))


def check_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error for a missing ``kimi_vl`` checkpoint, before lm-eval starts (task folders and names:
    :class:`EvalInputError` from :func:`run`)."""
    from kimi_vl.exports import require_export

    model_args = _model_args(args)
    if args.model == "kimi_vl" and "checkpoint" in model_args:
        require_export(parser, model_args["checkpoint"], "--model_args checkpoint")
    for flag in ("--samples_out", "--output_path"):  # made before the evaluation, not after it (results kept)
        value = getattr(args, flag[2:])
        if value:
            folder = Path(value) if flag == "--output_path" and Path(value).suffix != ".json" else Path(value).parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                parser.error(f"{flag} {value}: cannot create {folder}: {err}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "lm-eval":
        register()
        from lm_eval.__main__ import cli_evaluate

        sys.argv = ["lm-eval", *argv[1:]]
        cli_evaluate()
        return 0
    parser = build_parser()
    args = parser.parse_args(argv)
    check_inputs(parser, args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        results = run(args)
    except EvalInputError as err:
        parser.error(str(err))
    if results is None:  # non-zero ranks of a distributed run
        return 0
    _write_outputs(results, args)
    from lm_eval.utils import make_table

    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    return 0


__all__ = ["build_parser", "main", "register", "run"]
