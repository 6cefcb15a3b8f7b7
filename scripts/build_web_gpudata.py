"""A reduced ``web_small`` page dataset for a GPU machine without Chromium, packed as one ``.tar.gz``.

    python scripts/build_web_gpudata.py [--out .gpudata_web] [--work runs/gpudata_web] [--train-pages 200] \
        [--train-videos 100] [--eval-pages 50] [--eval-videos 50] [--workers 2]

Writes ``WORK/NAME/`` (shards, ``manifest.json`` and the tokenizer, exactly what ``synth:web_small`` builds, with
fewer training pages; the scorer reads the held-out inputs from it) and ``OUT/NAME.tar.gz`` (that folder, carried
to the GPU for ``scripts/gpu_web_small.sh``; alone in ``OUT``, so the folder can be carried whole). Sample seeds
depend only on ``(seed, split, family, index)`` and the writing order only on the counts, so with the default
eval counts (those of ``web_small``) the eval split is ``web_small``'s held-out page set, page for page; the
training pages are the first indices of ``web_small``'s. The tokenizer is trained on this training split
(``web_small``'s vocabulary size), as ``synth:PRESET`` does for a preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_pipelines.synth.build import build_dataset, default_vocab, get_preset, split_shards  # noqa: E402
from data_pipelines.tokenizer import iter_corpus_texts, train_tokenizer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=".gpudata_web", help="folder of NAME.tar.gz (ignored by git)")
    p.add_argument("--work", default="runs/gpudata_web", help="folder of the dataset NAME/ itself")
    p.add_argument("--name", default="web_small_r")
    p.add_argument("--train-pages", type=int, default=200)
    p.add_argument("--train-videos", type=int, default=100)
    p.add_argument("--eval-pages", type=int, default=50)
    p.add_argument("--eval-videos", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    base = get_preset("web_small")
    preset = dataclasses.replace(base, name=args.name,
                                 train={"page": args.train_pages, "page_video": args.train_videos},
                                 eval={"page": args.eval_pages, "page_video": args.eval_videos})
    root = Path(args.work) / args.name
    t0 = time.perf_counter()
    manifest = build_dataset(root, preset, seed=args.seed, workers=args.workers)
    train_tokenizer(iter_corpus_texts(split_shards(root, "train")), root / "tokenizer", default_vocab("web_small"))
    archive = Path(args.out) / f"{args.name}.tar.gz"
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz", compresslevel=9) as tar:
        tar.add(root, arcname=args.name)
    print(json.dumps({"data": str(root), "archive": str(archive), "archive_bytes": archive.stat().st_size,
                      "samples": {s: v["counts"] for s, v in manifest["splits"].items()},
                      "content_hash": manifest["content_hash"], "seconds": round(time.perf_counter() - t0, 1)},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
