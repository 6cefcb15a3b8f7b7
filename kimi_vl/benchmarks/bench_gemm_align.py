"""GPU timing of the KDA layer's small input map at two row counts: ``2K + H`` (262 in the small flavor) and that
padded to a multiple of 8 (``kda_layer.SMALL_PROJ_ALIGN``), with the two gate projections that read its output.

For each width N: the forward ``small = x W^T`` (x ``[M, D]``, W ``[N, D]``), the gate projections
``f_b(small[:, :K])`` and ``g_b(small[:, K:2K])`` (strided views, row stride N), and the backward (autograd of a
scalar of all three), timed by ``triton.testing.do_bench`` (median), with the names of the GEMM kernels cuBLAS ran
(torch.profiler). Writes ``$OUT/bench_gemm_align.json`` and prints a table.

    python -m kimi_vl.benchmarks.bench_gemm_align            # the small flavor at 8 x 4096 tokens
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F


def step(x: torch.Tensor, w: torch.Tensor, wf: torch.Tensor, wg: torch.Tensor, k: int, backward: bool) -> None:
    small = F.linear(x, w)
    y = F.linear(small[:, :k], wf) + F.linear(small[:, k:2 * k], wg)
    if backward:
        y.backward(torch.ones_like(y))


def kernels(fn) -> dict[str, float]:
    """GPU kernel names -> total ms of one call of ``fn``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.key[:90]] = out.get(e.key[:90], 0.0) + e.device_time_total / 1e3
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def time_width(m: int, d: int, k: int, h: int, n: int) -> dict:
    """Times and kernels of :func:`step` with an ``[n, d]`` small map."""
    from triton.testing import do_bench

    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(m, d, device=dev, dtype=dt, requires_grad=True)
    w = (torch.randn(n, d, device=dev, dtype=dt) * d ** -0.5).requires_grad_()
    wf, wg = ((torch.randn(h * k, k, device=dev, dtype=dt) * k ** -0.5).requires_grad_() for _ in range(2))
    with torch.no_grad():
        fwd = do_bench(lambda: step(x, w, wf, wg, k, False))
    both = do_bench(lambda: step(x, w, wf, wg, k, True), grad_to_none=[x, w, wf, wg])
    return {"fwd_ms": fwd, "fwd_bwd_ms": both, "kernels_ms": kernels(lambda: step(x, w, wf, wg, k, True))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_gemm_align.json"))
    args = ap.parse_args()
    m, d, k, h = args.tokens, args.hidden, args.head_dim, args.heads
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": m, "hidden": d, "rows": {}}
    print("| N | fwd ms | fwd+bwd ms | GEMM kernels (fwd+bwd, ms) |\n| --- | --- | --- | --- |")
    for n in (2 * k + h, -(-(2 * k + h) // 8) * 8):
        row = res["rows"][n] = time_width(m, d, k, h, n)
        gemms = ", ".join(f"{name.replace('void ', '')[:75]} {ms:.3f}" for name, ms in row["kernels_ms"].items()
                          if "gemm" in name or "nvjet" in name or "cutlass" in name)
        print(f"| {n} | {row['fwd_ms']:.3f} | {row['fwd_bwd_ms']:.3f} | {gemms} |")
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
