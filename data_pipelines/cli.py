"""``kimi-vl data``: build, inspect and tokenize datasets.

    kimi-vl data synth --out DIR --preset {tiny,small,large} --seed S [--workers N] [--vocab-size V]
    kimi-vl data inspect DIR [--out DIR2]
    kimi-vl data tokenizer --data DIR --out TOKDIR [--vocab-size V] [--text FILE ...]
    kimi-vl data convert-text --out DIR FILE.txt|FILE.jsonl ...
    kimi-vl data convert-videos --out DIR VIDEO_FOLDER

``synth`` writes the shards and ``manifest.json``, then trains a tokenizer into ``DIR/tokenizer`` (the
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


def _convert_text(args: argparse.Namespace) -> int:
    from data_pipelines.adapters import text_files_to_shards

    shards = text_files_to_shards(args.files, args.out, args.source)
    print(f"wrote {sum(s.count for s in shards)} documents in {len(shards)} shard(s) to {args.out}")
    return 0


def _convert_videos(args: argparse.Namespace) -> int:
    from data_pipelines.adapters import video_folder_to_shards

    shards = video_folder_to_shards(args.folder, args.out, args.source)
    print(f"wrote {sum(s.count for s in shards)} videos in {len(shards)} shard(s) to {args.out}")
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
    c = sub.add_parser("convert-text", help="user .txt/.jsonl files -> text shards")
    c.add_argument("--out", required=True)
    c.add_argument("--source", default="user_text")
    c.add_argument("files", nargs="+")
    c.set_defaults(fn=_convert_text)
    v = sub.add_parser("convert-videos", help="a folder of videos with same-stem .txt captions -> vision shards")
    v.add_argument("--out", required=True)
    v.add_argument("--source", default="user_video")
    v.add_argument("folder")
    v.set_defaults(fn=_convert_videos)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return int(args.fn(args) or 0)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"kimi-vl data {args.cmd}: error: {err}", file=sys.stderr)
        return 2
