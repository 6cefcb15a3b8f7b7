"""``python -m eval.tasks --out DIR``: write the kimi_text / kimi_vision suites (see :mod:`eval.tasks.writer`)."""

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
    args = p.parse_args(argv)
    if args.split == "train":
        raise SystemExit("--split train would evaluate on training data; use test or eval")
    lengths = tuple(int(v) for v in args.retrieval_lengths.split(",") if v.strip())
    spec = SuiteSpec(Path(args.out).resolve(), args.n, args.preset, args.seed, args.split, lengths, args.tokenizer)
    for suite, tasks in write_suites(spec, tuple(args.suites.split(","))).items():
        print(f"{suite}: {', '.join(tasks)}")
    print(f"run: kimi-vl eval --model_args checkpoint=DIR --tasks {args.suites} --include_path {spec.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
