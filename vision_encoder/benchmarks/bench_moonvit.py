"""GPU benchmark: packed (varlen) vs padded MoonViT encoding throughput, bf16, on a realistic size mix.

Both paths run the same weights on the same images in the same process: ``MoonViT.forward`` (packed,
block-diagonal varlen attention, no padding) and ``MoonViT.forward_padded`` (each image padded to the
longest one in the batch, SDPA with a key mask: the NaFlexViT-style batch). Throughput counts real
patches only; the padding share of the padded batch is reported.

    python -m vision_encoder.benchmarks.bench_moonvit            # writes $OUT/bench_moonvit.json (or ./)

Image mix (seeded): widths/heights drawn from document pages, photos, screenshots and thin banners
(aspect 1:8 .. 8:1), through the processor's navit resize with the 4096-patch budget.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from vision_encoder.config import moonvit_config
from vision_encoder.geometry import DEFAULT_GEOMETRY, patch_grid_hw
from vision_encoder.model import MoonViT

SIZE_MIX = [  # (width, height, weight)
    (640, 480, 3), (1024, 768, 2), (1920, 1080, 2), (1080, 1920, 1), (800, 1100, 2), (224, 224, 2),
    (336, 336, 1), (1280, 160, 1), (160, 1280, 1), (512, 512, 2), (2048, 1536, 1), (96, 96, 1),
]


def sample_grids(n: int, seed: int) -> torch.Tensor:
    """``[n, 3]`` grids (t = 1) for ``n`` images drawn from ``SIZE_MIX`` with +-30% jitter."""
    rng = random.Random(seed)
    sizes, weights = [(w, h) for w, h, _ in SIZE_MIX], [k for _, _, k in SIZE_MIX]
    grids = []
    for _ in range(n):
        w, h = rng.choices(sizes, weights)[0]
        w, h = int(w * rng.uniform(0.7, 1.3)), int(h * rng.uniform(0.7, 1.3))
        grids.append([1, *patch_grid_hw(h, w, DEFAULT_GEOMETRY)])
    return torch.tensor(grids)


def _time(fn, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def bench_flavor(flavor: str, images: int, warmup: int, iters: int, train: bool) -> dict:
    torch.manual_seed(0)
    model = MoonViT(moonvit_config(flavor, attention_backend="varlen")).cuda().to(torch.bfloat16)
    model.train(train)
    grid = sample_grids(images, seed=0)
    real = int(grid.prod(-1).sum())
    padded_total = len(grid) * int(grid.prod(-1).max())
    pv = torch.randn(real, 3, 14, 14, device="cuda", dtype=torch.bfloat16)

    def run(fwd):
        def step():
            if train:
                fwd(pv, grid).merged.float().square().mean().backward()
            else:
                with torch.no_grad():
                    fwd(pv, grid)
        return step

    with torch.no_grad():
        a, b = model(pv, grid).merged.float(), model.forward_padded(pv, grid).merged.float()
    rel = ((a - b).norm() / b.norm()).item()
    t_packed = _time(run(model.forward), warmup, iters)
    torch.cuda.reset_peak_memory_stats()
    t_padded = _time(run(model.forward_padded), warmup, iters)
    return {
        "flavor": flavor, "mode": "fwd+bwd" if train else "fwd", "images": images, "real_patches": real,
        "padded_patches": padded_total, "padding_share": 1 - real / padded_total,
        "packed_ms": t_packed * 1e3, "padded_ms": t_padded * 1e3,
        "packed_patches_per_s": real / t_packed, "padded_patches_per_s": real / t_padded,
        "speedup_packed_over_padded": t_padded / t_packed, "packed_vs_padded_rel_diff": rel,
        "params": model.num_params(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavors", default="small,so400m")
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_moonvit needs a CUDA GPU")
    rows = []
    for flavor in args.flavors.split(","):
        for train in (False, True):
            rows.append(bench_flavor(flavor, args.images, args.warmup, args.iters, train))
            r = rows[-1]
            print(f"{r['flavor']:>7} {r['mode']:>7} | packed {r['packed_patches_per_s']:>12,.0f} patch/s | "
                  f"padded {r['padded_patches_per_s']:>12,.0f} patch/s | x{r['speedup_packed_over_padded']:.2f} | "
                  f"padding {r['padding_share']:.0%} | rel diff {r['packed_vs_padded_rel_diff']:.1e}", flush=True)
    out = Path(os.environ.get("OUT", ".")) / "bench_moonvit.json"
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bfloat16",
            "date": time.strftime("%Y-%m-%d"), "command": "python -m vision_encoder.benchmarks.bench_moonvit"}
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
