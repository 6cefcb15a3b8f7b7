"""Throughput measurements quoted in data_pipelines/README.md.

    python -m data_pipelines.bench gen --preset small --samples 300     # generation, one core
    python -m data_pipelines.bench loader DIR --batches 20 --workers 1  # packed loader, images/s per worker

``gen`` times the first ``samples`` of the preset's training plan (a mix of all families) in one process
and extrapolates to the whole preset. ``loader`` builds packed batches from a built dataset with the
tokenizer in ``DIR/tokenizer``; ``--processor moonvit`` also runs ``vision_encoder.processor.MoonViTProcessor``
(resize + normalise + patchify), ``none`` measures decode + tokenize + pack only.
"""

from __future__ import annotations

import argparse
import json
import time

from data_pipelines.synth.build import generate_sample, get_preset, plan, split_shards


def bench_gen(preset_name: str, samples: int) -> dict:
    preset = get_preset(preset_name)
    tasks = plan(preset, "train", 0)[:samples]
    t0 = time.perf_counter()
    for family, index in tasks:
        generate_sample(preset, 0, "train", family, index)
    dt = time.perf_counter() - t0
    total = sum(preset.train.values()) + sum(preset.eval.values())
    rate = len(tasks) / dt
    return {"preset": preset_name, "timed_samples": len(tasks), "seconds": round(dt, 2),
            "samples_per_s_per_core": round(rate, 1), "preset_samples": total,
            "extrapolated_minutes_one_core": round(total / rate / 60, 1)}


def bench_loader(root: str, batches: int, workers: int, processor: str, seq_len: int, batch_size: int) -> dict:
    from data_pipelines.loader import LoaderConfig, VisionRatioSchedule, build_loader
    from data_pipelines.tokenizer import load_tokenizer

    proc = None
    if processor == "moonvit":
        from vision_encoder.processor import MoonViTProcessor

        proc = MoonViTProcessor()
    cfg = LoaderConfig(text_shards=split_shards(root, "train", "text"),
                       vision_shards=split_shards(root, "train", "vision"), seq_len=seq_len,
                       batch_size=batch_size, schedule=VisionRatioSchedule(1.0))
    loader = build_loader(cfg, load_tokenizer(f"{root}/tokenizer"), proc, num_workers=workers)
    it = iter(loader)
    next(it)  # start-up (worker spawn, first shard open) is not throughput
    images = frames = tokens = 0
    t0 = time.perf_counter()
    for _ in range(batches):
        b = next(it)
        images += len(b["image_hw"])
        frames += int(b["video_thw"][:, 0].sum()) if len(b["video_thw"]) else 0
        tokens += int(b["attention_mask"].sum())
    dt = time.perf_counter() - t0
    per = max(1, workers)
    return {"dataset": root, "workers": workers, "processor": processor, "batches": batches, "seconds": round(dt, 2),
            "images_per_s_per_worker": round(images / dt / per, 1), "video_frames_per_s_per_worker":
            round(frames / dt / per, 1), "tokens_per_s_per_worker": round(tokens / dt / per)}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m data_pipelines.bench")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--preset", default="tiny")
    g.add_argument("--samples", type=int, default=300)
    ld = sub.add_parser("loader")
    ld.add_argument("root")
    ld.add_argument("--batches", type=int, default=20)
    ld.add_argument("--workers", type=int, default=0)
    ld.add_argument("--processor", choices=["moonvit", "none"], default="moonvit")
    ld.add_argument("--seq-len", type=int, default=2048)
    ld.add_argument("--batch-size", type=int, default=4)
    a = p.parse_args()
    if a.cmd == "gen":
        print(json.dumps(bench_gen(a.preset, a.samples)))
    else:
        print(json.dumps(bench_loader(a.root, a.batches, a.workers, a.processor, a.seq_len, a.batch_size)))


if __name__ == "__main__":
    main()
