"""``kimi-vl data``: build, inspect and tokenize datasets.

    kimi-vl data synth --out DIR --preset {tiny,small,large} --seed S [--workers N] [--vocab-size V]
    kimi-vl data inspect DIR [--out DIR2]
    kimi-vl data tokenizer --data DIR --out TOKDIR [--vocab-size V] [--text FILE ...]
    kimi-vl data convert --out DIR [--text FILE ...] [--images FOLDER|FILE.jsonl ...] [--videos FOLDER ...]
                         [--shards TAR ...] [--eval-shards TAR ...] [--eval-fraction F] [--vocab-size V]

``synth`` and ``convert`` write the shards and ``manifest.json``, then train a tokenizer into ``DIR/tokenizer`` (the
training app's default) unless ``--vocab-size 0``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from data_pipelines.synth.build import PRESETS, default_vocab


def _synth(args: argparse.Namespace) -> int:
    from data_pipelines.synth import build_dataset, split_shards
    from data_pipelines.tokenizer import iter_corpus_texts, train_tokenizer

    t0 = time.perf_counter()
    manifest = build_dataset(args.out, args.preset, args.seed, workers=args.workers)
    dt = time.perf_counter() - t0
    n = manifest["total_samples"]
    print(f"wrote {n} samples ({manifest['total_bytes'] / 2**20:.1f} MiB) to {args.out} in {dt:.1f} s "
          f"({n / dt:.1f} samples/s with {args.workers} worker(s)); content hash {manifest['content_hash'][:16]}")
    vocab = default_vocab(args.preset) if args.vocab_size is None else args.vocab_size
    if vocab:
        t1 = time.perf_counter()
        tok = train_tokenizer(iter_corpus_texts(split_shards(args.out, "train")), os.path.join(args.out, "tokenizer"),
                              vocab)
        print(f"trained a {len(tok)}-token tokenizer in {time.perf_counter() - t1:.1f} s -> {args.out}/tokenizer")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from data_pipelines.inspection import inspect_dataset

    stats = inspect_dataset(args.path, args.out)
    print(json.dumps(stats, indent=1))
    print(f"contact sheet and stats.json in {args.out or os.path.join(args.path, 'inspect')}")
    return 0


def _tokenizer(args: argparse.Namespace) -> int:
    from data_pipelines.shards import list_shards
    from data_pipelines.tokenizer import iter_corpus_texts, train_tokenizer

    extra = []
    for path in args.text:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"text file does not exist: {path}")
        extra.append(open(path, encoding="utf-8").read())
    tok = train_tokenizer(iter_corpus_texts(list_shards(args.data), extra), args.out, args.vocab_size)
    print(f"trained a {len(tok)}-token tokenizer -> {args.out}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from data_pipelines.convert import convert_dataset

    t0 = time.perf_counter()
    m = convert_dataset(args.out, text=args.text, videos=args.videos, images=args.images, shards=args.shards,
                        eval_shards=args.eval_shards, eval_fraction=args.eval_fraction, vocab_size=args.vocab_size,
                        source=args.source)
    per_split = ", ".join(f"{split} {m['splits'][split]['samples']}" for split in m["splits"])
    print(f"wrote {m['total_samples']} samples ({per_split}; {m['total_bytes'] / 2**20:.1f} MiB) to {args.out} in "
          f"{time.perf_counter() - t0:.1f} s" + ("" if not args.vocab_size else f", tokenizer in {args.out}/tokenizer"))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kimi-vl data", description="build, inspect and tokenize datasets")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("synth", help="generate the synthetic multimodal world into shards")
    s.add_argument("--out", required=True)
    s.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--workers", type=int, default=1, help="generator processes (output does not depend on it)")
    s.add_argument("--vocab-size", type=int, default=None, help="tokenizer vocabulary (0: no tokenizer)")
    s.set_defaults(fn=_synth)
    i = sub.add_parser("inspect", help="statistics and a PNG contact sheet of a dataset")
    i.add_argument("path")
    i.add_argument("--out", default=None)
    i.set_defaults(fn=_inspect)
    t = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer on shards (+ text files)")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--vocab-size", type=int, default=8192)
    t.add_argument("--text", nargs="*", default=[])
    t.set_defaults(fn=_tokenizer)
    c = sub.add_parser("convert", help="your text, images (captions, questions), videos or shards -> a dataset folder",
                       description="Write a dataset folder (train/eval shards, manifest.json, tokenizer) that "
                       "data.path of training and RL reads. JSONL lines: {\"image\": PATH or [PATHS] (or "
                       "\"video\": PATH), \"caption\": ..., \"question\": ..., \"answer\": ..., \"split\": train|eval} "
                       "(see data_pipelines/README.md).")
    c.add_argument("--out", required=True, help="a new or empty folder")
    c.add_argument("--text", nargs="+", default=[], metavar="FILE", help=".txt (cut at blank lines) or .jsonl "
                   "(text or messages per line)")
    c.add_argument("--images", nargs="+", default=[], metavar="PATH", help="folders of images with same-stem .txt "
                   "captions, or .jsonl files of images (or a video) per line with captions and/or questions")
    c.add_argument("--videos", nargs="+", default=[], metavar="FOLDER", help="folders of videos with same-stem .txt "
                   "captions")
    c.add_argument("--shards", nargs="+", default=[], metavar="TAR", help="webdataset shards (files, folders, globs) "
                   "for the train split")
    c.add_argument("--eval-shards", nargs="+", default=[], metavar="TAR", help="webdataset shards for the eval split")
    c.add_argument("--eval-fraction", type=float, default=0.05, help="share of the other samples held out "
                   "(evenly spaced per stream; at least one of two or more)")
    c.add_argument("--vocab-size", type=int, default=8192, help="tokenizer vocabulary (0: no tokenizer)")
    c.add_argument("--source", default="user", help="prefix of the families and sample keys")
    c.set_defaults(fn=_convert)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return int(args.fn(args) or 0)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"kimi-vl data {args.cmd}: error: {err}", file=sys.stderr)
        return 2
