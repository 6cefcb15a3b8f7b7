"""GPU benchmark of the AttnRes mix with its sublayer's RMSNorm in one kernel (``kernels/attn_res/mix_norm_triton.py``)
against the two kernels one after the other (``mix_triton``'s pointer-argument mix, then ``kernels/norm``'s RMSNorm;
backward: the norm's, then the mix's).

At the ``small`` flavor's step (``M = 8 x 4096`` tokens, ``D = 768``, bf16), for ``N`` sources: forward and backward as
the GPU time of CUDA graph replays (``triton.testing.do_bench_cudagraph``, median), each backward both as a plain mix
(every source's gradient written) and as a deferring one (all but the last source deferred; the fused kernel then
stores ``dh`` for the block's flush). The minimum traffic's bytes/s beside the measured copy bandwidth, and the fused
outputs' relative RMS difference from the separate path on the same inputs. JSON to ``$OUT/bench_mix_norm.json`` (or
``--out``) and a table.

    python kernels/benchmarks/bench_mix_norm.py [--sources 2 3 4 5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kernels.attn_res import mix_triton as mt  # noqa: E402
from kernels.attn_res.mix_norm_triton import mix_norm_bwd_triton, mix_norm_fwd_triton  # noqa: E402
from kernels.attn_res.mix_triton import mix_bwd_triton, mix_fwd_triton  # noqa: E402
from kernels.benchmarks.constants import overridden  # noqa: E402
from kernels.norm import norm_triton as nt  # noqa: E402

M, D = 8 * 4096, 768


def bench_graph(fn) -> float:
    """GPU time (ms) of ``fn`` replayed from a CUDA graph, after one eager call (compiles, first launches)."""
    fn()
    with torch.cuda.stream(torch.cuda.Stream()):
        return float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def copy_gbps() -> float:
    x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    return 2 * (1 << 30) / float(triton.testing.do_bench(lambda: y.copy_(x), return_mode="median")) / 1e6


def inputs(n: int, dtype: torch.dtype) -> dict:
    g = torch.Generator(device="cuda").manual_seed(n)
    src = [(torch.randn(M, D, device="cuda", generator=g) * (1 + 0.2 * i)).to(dtype) for i in range(n)]
    u = torch.randn(D, device="cuda", generator=g) * 0.05
    nw = (1 + 0.1 * torch.randn(D, device="cuda", generator=g)).to(dtype)
    dy = torch.randn(M, D, device="cuda", generator=g).to(dtype)
    return dict(src=src, u=u, nw=nw, dy=dy)


def case(n: int, copy: float, dtype: torch.dtype = torch.bfloat16, extra: tuple[str, ...] = ()) -> dict:
    """One ``n``; ``extra``: ``NAME=VALUE`` settings of ``mix_triton``'s constants under which the fused backward is
    timed again (``fused <setting>_ms``)."""
    a = inputs(n, dtype)
    src, u, nw, dy = a["src"], a["u"], a["nw"], a["dy"]
    h, rstd, alpha = mix_fwd_triton(src, u, 1e-6)
    y, hr = nt.norm_fwd(h, None, nw, 1e-6)
    yf, hrf, rstdf, alphaf = mix_norm_fwd_triton(src, u, 1e-6, nw, 1e-6)
    state = M * D * dtype.itemsize
    out = {"n": n, "fwd": {}, "bwd": {}, "diff": {"y": rel_rms(yf, y), "rstd_h": rel_rms(hrf, hr),
                                                   "alpha": rel_rms(alphaf, alpha)}}
    out["fwd"]["separate_ms"] = bench_graph(lambda: nt.norm_fwd(mix_fwd_triton(src, u, 1e-6)[0], None, nw, 1e-6))
    out["fwd"]["fused_ms"] = bench_graph(lambda: mix_norm_fwd_triton(src, u, 1e-6, nw, 1e-6))
    out["fwd"]["fused_bytes"] = (n + 1) * state
    out["fwd"]["fused_pct_of_copy"] = 100 * (n + 1) * state / out["fwd"]["fused_ms"] / 1e6 / copy
    for mode, defer in (("plain", 0), ("deferred", (1 << (n - 1)) - 1)):
        def separate(defer=defer):
            dh = nt.norm_bwd(h, None, nw, hr, dy)[0]
            return mix_bwd_triton(src, u, dh, rstd, alpha, None, defer)

        def fused(defer=defer):
            return mix_norm_bwd_triton(src, u, nw, dy, hr, rstd, alpha, None, defer, store_dh=bool(defer))

        dxs, du, coef = separate()
        dxf, duf, dwf, coeff, dhf = fused()
        dw = nt.norm_bwd(h, None, nw, hr, dy)[2]
        diff = {"du": rel_rms(duf, du), "dw": rel_rms(dwf, dw)}
        diff |= {f"dx{i}": rel_rms(f, s) for i, (f, s) in enumerate(zip(dxf, dxs)) if s is not None}
        if coef is not None:
            nd = bin(defer).count("1")  # the deferred sources are the first nd: only their rows are written
            diff["coef"] = rel_rms(coeff[:nd], coef[:nd])
            diff["dh"] = rel_rms(dhf, nt.norm_bwd(h, None, nw, hr, dy)[0])
        written = n - bin(defer).count("1")
        moved = (1 + n + written + (1 if defer else 0)) * state  # dy, sources, gradients, dh
        r = {"separate_ms": bench_graph(separate), "fused_ms": bench_graph(fused), "fused_bytes": moved}
        r["fused_pct_of_copy"] = 100 * moved / r["fused_ms"] / 1e6 / copy
        for pair in extra:
            name, _, value = pair.partition("=")
            with overridden([(mt, name, int(value))]):
                r[f"fused {pair}_ms"] = bench_graph(fused)
        out["bwd"][mode], out["diff"][mode] = r, diff
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sources", type=int, nargs="+", default=[2, 3, 4, 5])
    ap.add_argument("--fused-set", nargs="*", default=[], metavar="NAME=INT",
                    help="mix_triton constants under which the fused backward is timed again, one at a time")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    copy = copy_gbps()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), "M": M, "D": D, "copy_gbps": copy,
           "cases": [case(n, copy, extra=tuple(args.fused_set)) for n in args.sources]}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_mix_norm.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{res['device']}, copy {copy:.0f} GB/s; M = {M}, D = {D}, bf16; GPU ms (CUDA graph), separate -> fused")
    print("| N | forward | plain backward | deferred backward | worst diff |")
    print("| --- | --- | --- | --- | --- |")
    for c in res["cases"]:
        f, p, d = c["fwd"], c["bwd"]["plain"], c["bwd"]["deferred"]
        worst = max(v for k, v in _flat(c["diff"]))
        print(f"| {c['n']} | {f['separate_ms']:.4f} -> {f['fused_ms']:.4f} ({f['fused_pct_of_copy']:.0f}%) | "
              f"{p['separate_ms']:.4f} -> {p['fused_ms']:.4f} ({p['fused_pct_of_copy']:.0f}%) | "
              f"{d['separate_ms']:.4f} -> {d['fused_ms']:.4f} ({d['fused_pct_of_copy']:.0f}%) | {worst:.1e} |")
        for pair in args.fused_set:
            print(f"|   fused backward with {pair} | | {p[f'fused {pair}_ms']:.4f} | {d[f'fused {pair}_ms']:.4f} | |")


def _flat(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


if __name__ == "__main__":
    main()
