"""Print a short summary of a ``bench_backbone --profile`` JSON for the GPU session logs: the hybrid's step and MFU
(plain and device-bound), its profiled kernel time and peak memory, the kernel categories, and the top kernels of
one category.

    python3 scripts/backbone_summary.py $OUT/run/bench_backbone.json kda
"""

from __future__ import annotations

import json
import sys


def summary(path: str, category: str) -> str:
    r = json.load(open(path))
    t, p = r["train"]["hybrid"][0], r["profile"]["hybrid"]
    lines = [f"step {1e3 * t['step_s']:.2f} ms (MFU {t['mfu']:.1%}), device-bound {1e3 * t['step_s_device_bound']:.2f}"
             f" ms (MFU {t['mfu_device_bound']:.1%}); kernels {p['gpu_ms']:.2f} ms; peak {t['peak_mem_gib']:.2f} GiB",
             str({k: round(v, 3) for k, v in p["categories_ms"].items()})]
    lines += [f"  {k['ms']:.3f} ms {k['calls']} calls {k['name'][:90]}" for k in p["top_kernels"]
              if k["category"] == category]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: backbone_summary.py BENCH_BACKBONE_JSON CATEGORY")
    print(summary(sys.argv[1], sys.argv[2]))
