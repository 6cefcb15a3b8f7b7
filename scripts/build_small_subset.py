"""A scaled copy of the ``small`` preset for the GPU machine, packed as ``OUT/small_subset.tar.gz``.

    python scripts/build_small_subset.py [--out .gpudata] [--work runs/gpudata] [--scale 0.3333] [--workers 2]

Writes ``WORK/small_subset/`` (shards, ``manifest.json`` and a tokenizer of ``small``'s vocabulary size trained on
its training split) and the archive that the GPU scripts unpack to ``/tmp/data`` (``scripts/gpu_session10.sh``
and earlier). Every family keeps ``small``'s image and video sizes; only the counts are scaled (at least 1 per
family). The default (1/3, seed 0) is what session 10 measured with: 3,160 samples, 32 MiB, ~30 s on 2 cores.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_pipelines.synth.build import PRESETS, build_dataset, default_vocab, split_shards  # noqa: E402
from data_pipelines.tokenizer import iter_corpus_texts, train_tokenizer  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".gpudata")
    p.add_argument("--work", default="runs/gpudata")
    p.add_argument("--scale", type=float, default=1 / 3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    if not 0 < args.scale <= 1:
        raise SystemExit(f"--scale must be in (0, 1], got {args.scale}")
    data = Path(args.work) / "small_subset"
    if data.exists():
        shutil.rmtree(data)
    t0 = time.perf_counter()
    manifest = build_dataset(data, PRESETS["small"].scaled(args.scale), args.seed, workers=args.workers)
    train_tokenizer(iter_corpus_texts(split_shards(data, "train")), data / "tokenizer", default_vocab("small"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "small_subset.tar.gz", "w:gz") as tar:
        tar.add(data, arcname="small_subset")
    print(f"{manifest['total_samples']} samples ({manifest['total_bytes'] / 2**20:.1f} MiB) in "
          f"{time.perf_counter() - t0:.1f} s -> {out / 'small_subset.tar.gz'}")


if __name__ == "__main__":
    main()
