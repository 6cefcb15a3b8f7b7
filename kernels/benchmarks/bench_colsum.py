"""GPU kernel time of the backward's column sums: ``kernels.colsum.column_sum`` (one launch, cast included) against
what the callers ran before, ATen's zero-filled partial buffer, ``sum(0)`` and the cast to the parameter's dtype,
at the small flavor's shapes (8 x 4096 tokens, D = 768, 6 KDA heads of 128).

Each variant runs ``--calls`` times under ``torch.profiler``; the table gives the device time a call summed over its
kernels and the number of kernels a call (the fill of the partial buffer counted for ATen: the callers zero-filled
it, and each launch also costs ~1.5 us of idle device time between kernels in the model's step). JSON to
``$OUT/bench_colsum.json``.

    python kernels/benchmarks/bench_colsum.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernels.colsum import column_sum  # noqa: E402
from kernels.profiling import kernel_events, kernel_ms  # noqa: E402

# (what, partial shape, output dtype): RMSNorm gains (hidden 768: 1024 programs; the KDA head norm 128 and MLA's
# 512-wide latent norm), the KDA gate's A_log / dt_bias partials, the conv weight [P, D, W], KDA dbeta slots, the
# AttnRes query gradient (264 programs)
SHAPES = [
    ("norm gain, D = 768", (1024, 768), torch.bfloat16),
    ("head norm gain, D = 128", (768, 128), torch.bfloat16),
    ("latent norm gain, D = 512", (512, 512), torch.bfloat16),
    ("gate A_log", (1024, 6), torch.float32),
    ("gate dt_bias", (1024, 6, 128), torch.float32),
    ("conv weight", (256, 2304, 4), torch.bfloat16),
    ("KDA dbeta slots", (3, 8 * 4096 * 6), torch.float32),
    ("AttnRes query", (264, 768), torch.float32),
]


def device_ms(fn, calls: int) -> tuple[float, float]:
    """(device ms a call summed over its kernels and memsets, kernels a call) of ``calls`` calls of ``fn``."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return kernel_ms(prof) / calls, len(kernel_events(prof)) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    rows = []
    for what, shape, dtype in SHAPES:
        partial = torch.randn(shape, device="cuda")
        ref = partial.double().sum(0)
        got = column_sum(partial, dtype)
        err = float((got.double() - ref).norm() / ref.norm())
        ours, ours_k = device_ms(lambda p=partial, d=dtype: column_sum(p, d), args.calls)
        zero_ms, _ = device_ms(lambda p=partial: torch.zeros_like(p), args.calls)
        red, red_k = device_ms(lambda p=partial, d=dtype: p.sum(0).to(d), args.calls)
        rows.append({"what": what, "shape": list(shape), "dtype": str(dtype), "column_sum_ms": ours,
                     "column_sum_kernels": ours_k, "aten_ms": zero_ms + red, "aten_kernels": red_k + 1,
                     "aten_fill_ms": zero_ms, "rel_err_vs_fp64": err})
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_colsum.json").write_text(json.dumps(out, indent=2))
    print(f"{out['device']}, torch {out['torch']}, {args.calls} calls each")
    print("| partials | shape -> dtype | ATen fill + sum + cast us (kernels) | column_sum us (kernels) | rel. err. |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['what']} | {tuple(r['shape'])} -> {r['dtype'].replace('torch.', '')} | "
              f"{1e3 * r['aten_ms']:.1f} ({r['aten_kernels']:.0f}) | {1e3 * r['column_sum_ms']:.1f} "
              f"({r['column_sum_kernels']:.0f}) | {r['rel_err_vs_fp64']:.1e} |")


if __name__ == "__main__":
    main()
