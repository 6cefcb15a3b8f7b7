"""Throughput measurements quoted in data_pipelines/README.md.

    python -m data_pipelines.bench gen --preset small --samples 300     # generation, one core
    python -m data_pipelines.bench loader DIR --batches 20 --workers 1  # packed loader, images/s per worker
    python -m data_pipelines.bench convert --images 2000                # kimi-vl data convert of image questions

``gen`` times the first ``samples`` of the preset's training plan (a mix of all families) in one process
and extrapolates to the whole preset. ``loader`` builds packed batches from a built dataset with the
tokenizer in ``DIR/tokenizer``; ``--processor moonvit`` also runs ``vision_encoder.processor.MoonViTProcessor``
(resize + normalise + patchify), ``none`` measures decode + tokenize + pack only. ``convert`` draws ``images`` PNGs
(sides 100-639 px, a few red dots) with a question and caption each into a temporary folder, then times
``data_pipelines.convert.convert_dataset`` on their JSONL without and with the tokenizer.
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


def bench_convert(images: int, seed: int = 0) -> dict:
    import random
    import tempfile
    from pathlib import Path

    from PIL import Image, ImageDraw

    from data_pipelines.convert import convert_dataset

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "imgs").mkdir()
        lines, png_bytes = [], 0
        for i in range(images):
            w, h = rng.randrange(100, 640), rng.randrange(100, 640)
            im = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
            dots = rng.randrange(1, 6)
            for _ in range(dots):
                x, y = rng.randrange(w - 30), rng.randrange(h - 30)
                ImageDraw.Draw(im).ellipse([x, y, x + 25, y + 25], fill="red")
            im.save(d / "imgs" / f"{i}.png")
            png_bytes += (d / "imgs" / f"{i}.png").stat().st_size
            lines.append({"image": f"imgs/{i}.png", "caption": f"A picture with {dots} red dots.",
                          "question": "How many red dots?", "answer": dots})
        (d / "q.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        out = {"images": images, "png_mib": round(png_bytes / 2**20, 1)}
        for name, vocab in (("seconds_no_tokenizer", 0), ("seconds_with_tokenizer", 8192)):
            t0 = time.perf_counter()
            convert_dataset(d / f"ds{vocab}", images=[d / "q.jsonl"], vocab_size=vocab)
            out[name] = round(time.perf_counter() - t0, 2)
        out["images_per_s"] = round(images / out["seconds_no_tokenizer"], 1)
        return out


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
    cv = sub.add_parser("convert")
    cv.add_argument("--images", type=int, default=2000)
    a = p.parse_args()
    if a.cmd == "gen":
        print(json.dumps(bench_gen(a.preset, a.samples)))
    elif a.cmd == "convert":
        print(json.dumps(bench_convert(a.images)))
    else:
        print(json.dumps(bench_loader(a.root, a.batches, a.workers, a.processor, a.seq_len, a.batch_size)))


if __name__ == "__main__":
    main()
