"""Where the MoonViT forward (+ backward) of a training step's packed image batch spends its time (GPU).

Builds the encoder of ``--flavor`` with the projector, a packed batch of ``--grids`` (default: an app-like mix of 11
images and one 2-frame video chunk, ~4.3k patches), fp32 weights under bf16 autocast as the training app runs it, and
times per variant (QK max-logit tracking on / off; forward / forward + backward): the wall time per call (CUDA
synchronised, median of ``--iters``), the GPU time of the same call (the sum of its kernels, ``torch.profiler``), their
ratio (well under 1: the host is the bottleneck), the number of kernels, and the top operators by host time and by
GPU time. JSON to ``$OUT/profile_moonvit.json`` (``--json``) and a short table on stdout; about 30 s on an H100.

    python -m vision_encoder.benchmarks.profile_moonvit
    python -m vision_encoder.benchmarks.profile_moonvit --chunks 40,4  # 40 images (sides 2..24 patches), 4 video chunks
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

from kernels.profiling import kernel_events
from vision_encoder.config import moonvit_config
from vision_encoder.model import MoonViT

APP_GRIDS = "1x16x20*4,1x12x16*4,1x20x24*3,2x16x24"


def parse_grids(text: str) -> torch.Tensor:
    rows = []
    for part in text.split(","):
        spec, _, times = part.partition("*")
        rows += [[int(v) for v in spec.split("x")]] * int(times or 1)
    return torch.tensor(rows)


def chunk_mix(images: int, video_chunks: int, max_side: int, seed: int = 0) -> torch.Tensor:
    """``[images + video_chunks, 3]``: ``images`` single frames with even ``h, w`` drawn from ``[2, max_side]``
    patches, then the chunks of one video clip (its own ``h x w``; 4 frames each, the last one 2), the way the
    training app's packed batch mixes many images with the chunks of a video."""
    rng = random.Random(seed)
    sides = range(2, max_side + 1, 2)
    rows = [[1, rng.choice(sides), rng.choice(sides)] for _ in range(images)]
    h, w = rng.choice(sides), rng.choice(sides)
    rows += [[4 if i < video_chunks - 1 else 2, h, w] for i in range(video_chunks)]
    return torch.tensor(rows)


def batch_grids(grids: str, chunks: str | None, max_side: int) -> torch.Tensor:
    """``--chunks IMAGES,VIDEO_CHUNKS`` (a :func:`chunk_mix`) when given, else the explicit ``--grids``."""
    if chunks is None:
        return parse_grids(grids)
    images, _, videos = chunks.partition(",")
    return chunk_mix(int(images), int(videos or 0), max_side)


def run(model: MoonViT, px: torch.Tensor, grid: torch.Tensor, backward: bool) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(px, grid).projected
    if backward:
        out.float().square().mean().backward()


def measure(model: MoonViT, px, grid, backward: bool, iters: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        run(model, px, grid, backward)
    walls = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(model, px, grid, backward)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run(model, px, grid, backward)
        torch.cuda.synchronize()
    kernels = kernel_events(prof)
    gpu_ms = sum(e.device_time_total for e in kernels) / 1000
    avg = prof.key_averages()
    by_cpu = sorted(avg, key=lambda e: -e.self_cpu_time_total)[:top]
    by_gpu = sorted(avg, key=lambda e: -e.self_device_time_total)[:top]
    wall_ms = 1000 * statistics.median(walls)
    return {"wall_ms": wall_ms, "gpu_ms": gpu_ms, "gpu_busy": gpu_ms / wall_ms, "kernels": len(kernels),
            "top_cpu": [(e.key[:80], e.count, round(e.self_cpu_time_total / 1000, 3)) for e in by_cpu],
            "top_gpu": [(e.key[:80], e.count, round(e.self_device_time_total / 1000, 3)) for e in by_gpu]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flavor", default="small")
    ap.add_argument("--grids", default=APP_GRIDS, help="TxHxW[*count],... in patches")
    ap.add_argument("--chunks", default=None, help="IMAGES,VIDEO_CHUNKS: a seeded many-chunk mix (replaces --grids)")
    ap.add_argument("--max-side", type=int, default=24, help="largest image side in patches for --chunks")
    ap.add_argument("--json", default="profile_moonvit.json", help="file name under $OUT")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = MoonViT(moonvit_config(args.flavor, out_hidden_size=768)).cuda()
    grid = batch_grids(args.grids, args.chunks, args.max_side)
    px = torch.randn(int(grid.prod(-1).sum()), 3, 14, 14, device="cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "flavor": args.flavor,
           "patches": px.shape[0], "chunks": grid.shape[0], "grids": args.chunks or args.grids,
           "rope_backend": os.environ.get("KVL_ROPE_BACKEND", "default"), "variants": {}}
    for track in (False, True):
        for mod in model.modules():
            if hasattr(mod, "track_max_logits"):
                mod.track_max_logits = track
        for backward in (False, True):
            name = f"{'fwd+bwd' if backward else 'fwd'}, qk max {'on' if track else 'off'}"
            res["variants"][name] = measure(model, px, grid, backward, args.iters, args.top)
    out = Path(os.environ.get("OUT", ".")) / args.json
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"{res['device']}, MoonViT-{args.flavor}, {res['patches']} patches in {res['chunks']} chunks")
    print("| variant | wall ms | GPU ms | GPU busy | kernels |\n| --- | --- | --- | --- | --- |")
    for name, r in res["variants"].items():
        print(f"| {name} | {r['wall_ms']:.1f} | {r['gpu_ms']:.1f} | {r['gpu_busy']:.0%} | {r['kernels']} |")
    worst = res["variants"]["fwd, qk max on"]
    print("top host time (fwd, qk max on):", *[f"  {k} x{n}: {ms} ms" for k, n, ms in worst["top_cpu"]], sep="\n")
    print("top GPU time (fwd, qk max on):", *[f"  {k} x{n}: {ms} ms" for k, n, ms in worst["top_gpu"]], sep="\n")


if __name__ == "__main__":
    main()
