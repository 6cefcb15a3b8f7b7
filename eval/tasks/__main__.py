"""``python -m eval.tasks --out DIR``: write the kimi_text / kimi_vision suites (see :mod:`eval.tasks.writer`);
with ``--data DATASET``, the kimi_data suite of a dataset folder's held-out questions instead
(:mod:`eval.tasks.dataset_suite`)."""

import argparse
import sys
from pathlib import Path

from eval.tasks.writer import SuiteSpec, write_suites


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.tasks", description="write offline lm-eval task suites")
    p.add_argument("--out", required=True, help="directory to write (pass it to --include_path)")
    p.add_argument("--n", type=int, default=50, help="samples per family (each gives several questions)")
    p.add_argument("--preset", default="tiny", help="data_pipelines.synth preset (image sizes, video length)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="test", help="held-out split (never 'train')")
    p.add_argument("--suites", default="kimi_text,kimi_vision")
    p.add_argument("--retrieval-lengths", default="", help="e.g. 256,1024,4096: write kimi_text_retrieval_<L>")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder that sizes the retrieval prompts exactly")
    p.add_argument("--data", default=None, help="a dataset folder (kimi-vl data convert / synth): write the kimi_data "
                   "suite from its eval split's image questions instead")
    args = p.parse_args(argv)
    if args.data is not None:
        return _dataset_suite(p, args)
    if args.split == "train":
        raise SystemExit("--split train would evaluate on training data; use test or eval")
    lengths = tuple(int(v) for v in args.retrieval_lengths.split(",") if v.strip())
    spec = SuiteSpec(Path(args.out).resolve(), args.n, args.preset, args.seed, args.split, lengths, args.tokenizer)
    extra = []
    for suite, tasks in write_suites(spec, tuple(args.suites.split(","))).items():
        grouped = _group_tasks(spec.out / suite / f"{suite}.yaml")
        print(f"{suite}: {', '.join(t for t in tasks if t in grouped)}")
        extra += [t for t in tasks if t not in grouped]
    if extra:
        print(f"also written, outside the groups (name them in --tasks): {', '.join(extra)}")
    print(f"run: kimi-vl eval --model_args checkpoint=DIR --tasks {args.suites} --include_path {spec.out}")
    return 0


def _group_tasks(group_yaml: Path) -> list[str]:
    """The task names of a group file written by :func:`write_suites`."""
    import yaml

    return list(yaml.safe_load(group_yaml.read_text())["task"])


def _dataset_suite(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from eval.tasks.dataset_suite import GROUP, write_dataset_suite

    if not (Path(args.data) / "manifest.json").is_file():
        p.error(f"--data {args.data}: no manifest.json there (a folder of `kimi-vl data convert` or `data synth`)")
    out = Path(args.out).resolve()
    try:
        tasks = write_dataset_suite(args.data, out)
    except ValueError as err:
        p.error(str(err))
    print(f"{GROUP}: {', '.join(tasks)}")
    print(f"run: kimi-vl eval --model_args checkpoint=DIR --tasks {GROUP} --include_path {out / GROUP}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
