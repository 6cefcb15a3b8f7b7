"""GPU benchmark of ``kernels/norm``: fused Triton RMSNorm, gated RMSNorm and SwiGLU activation vs the PyTorch path.

At the ``small`` model's shapes for one 8 x 4096-token step (bf16; the KDA norm also with an fp32 residual
stream as under autocast): forward and forward+backward time, both as the GPU time of a CUDA graph replay
(``triton.testing.do_bench_cudagraph``: kernels only) and as eager calls (``do_bench``: with the host's launch
and autograd work, which at these sizes can exceed the GPU time), the minimum traffic's bytes/s (GPU time) next
to the measured device-copy bandwidth, and each output's relative RMS error
against fp64 on the same inputs for both paths. JSON to ``$OUT/bench_norm.json`` (or ``--out``) and a table;
about 15 s on an H100.

    python kernels/benchmarks/bench_norm.py
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

from kernels.norm import gated_rms_norm, rms_norm, silu_mul  # noqa: E402

M = 8 * 4096
CASES = {  # name -> (op, x shape, x dtype, weight dtype)
    "rms_norm [32768, 768] bf16": ("rms", (M, 768), torch.bfloat16, torch.bfloat16),
    "rms_norm [32768, 768] fp32 x, fp32 w": ("rms", (M, 768), torch.float32, torch.float32),
    "gated_rms_norm [32768, 6, 128] bf16": ("gated", (M, 6, 128), torch.bfloat16, torch.float32),
    "silu_mul [32768, 2 x 2048] bf16": ("silu_mul", (M, 4096), torch.bfloat16, None),
}


def bench(fn, grad_to_none=None) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=50, grad_to_none=grad_to_none, return_mode="median"))


def bench_graph(fn) -> float:
    """GPU time of ``fn`` replayed from a CUDA graph (no host work in the timing)."""
    with torch.cuda.stream(torch.cuda.Stream()):
        return float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def copy_bandwidth() -> float:
    x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    return 2 * (1 << 30) / bench(lambda: y.copy_(x)) / 1e6  # GB/s


def make(op: str, shape, dtype, w_dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", generator=g).to(dtype)
    ins = [x]
    if op == "gated":
        ins.append(torch.randn(shape, device="cuda", generator=g).to(dtype))
    if op != "silu_mul":
        ins.append((1 + 0.1 * torch.randn(shape[-1], device="cuda", generator=g)).to(w_dtype))
    out_shape = (*shape[:-1], shape[-1] // 2) if op == "silu_mul" else shape
    return ins, torch.randn(out_shape, device="cuda", generator=g).to(dtype)


def call(op: str, ins, backend: str):
    if op == "rms":
        return rms_norm(*ins, 1e-6, backend=backend)
    if op == "gated":
        return gated_rms_norm(*ins, 1e-6, backend=backend)
    return silu_mul(*ins, backend=backend)


def fwd_bwd(op: str, ins, dy, backend: str):
    leaves = [t.detach().requires_grad_(True) for t in ins]
    y = call(op, leaves, backend)
    y.backward(dy)
    return y.detach(), [t.grad for t in leaves]


def case(op, shape, dtype, w_dtype, copy_gbps: float) -> dict:
    ins, dy = make(op, shape, dtype, w_dtype)
    y64, g64 = fwd_bwd(op, [t.double() for t in ins], dy.double(), "torch")
    res = {}
    act_bytes = sum(t.numel() * t.element_size() for t in ins if t.dim() > 1)
    out_bytes = dy.numel() * dy.element_size()
    fwd_bytes, bwd_bytes = act_bytes + out_bytes, 2 * act_bytes + out_bytes  # reads (+ dy) and writes
    for backend in ("triton", "torch"):
        y, grads = fwd_bwd(op, ins, dy, backend)
        leaves = [t.detach().requires_grad_(True) for t in ins]

        def fwd(backend=backend):
            with torch.no_grad():
                call(op, ins, backend)

        def both(backend=backend, leaves=leaves):
            for t in leaves:
                t.grad = None
            call(op, leaves, backend).backward(dy)

        f_ms, fb_ms = bench_graph(fwd), bench_graph(both)
        res[backend] = {
            "fwd_ms": round(f_ms, 4), "fwd_bwd_ms": round(fb_ms, 4),
            "eager_fwd_ms": round(bench(fwd), 4), "eager_fwd_bwd_ms": round(bench(both), 4),
            "fwd_frac_of_copy": round(fwd_bytes / f_ms / 1e6 / copy_gbps, 3),
            "fwd_bwd_frac_of_copy": round((fwd_bytes + bwd_bytes) / fb_ms / 1e6 / copy_gbps, 3),
            "err_y": rel_rms(y, y64), "err_grads": [rel_rms(a, b) for a, b in zip(grads, g64)],
        }
    res["speedup_fwd_bwd"] = round(res["torch"]["fwd_bwd_ms"] / res["triton"]["fwd_bwd_ms"], 2)
    return res


# the RMSNorm backward's launch settings timed by --bwd-sweep: (name, {norm_triton constant: value})
BWD_SETTINGS = [
    ("tile kernel", {"NORM_BWD_ROWS": False}),
    ("default", {}),
    ("rows at every width", {"NORM_ROWS_MAX_CHUNKS": 8}),
    ("rows at every width, 8 elems", {"NORM_ROWS_MAX_CHUNKS": 8, "NORM_ROWS_THREAD_ELEMS": 8}),
    ("rows at every width, 16 elems", {"NORM_ROWS_MAX_CHUNKS": 8, "NORM_ROWS_THREAD_ELEMS": 16}),
    ("rows at every width, 4 a SM", {"NORM_ROWS_MAX_CHUNKS": 8, "NORM_ROWS_PROGRAMS_PER_SM": 4}),
    ("rows at every width, 16 a SM", {"NORM_ROWS_MAX_CHUNKS": 8, "NORM_ROWS_PROGRAMS_PER_SM": 16}),
    ("tile, 8 warps", {"NORM_BWD_ROWS": False, "NORM_BWD_WARPS": 8}),
    ("tile, 2048 elems", {"NORM_BWD_ROWS": False, "NORM_BWD_TILE_ELEMS": 2048}),
    ("tile, 8192 elems, 8 warps", {"NORM_BWD_ROWS": False, "NORM_BWD_TILE_ELEMS": 8192, "NORM_BWD_WARPS": 8}),
    ("tile, 4 tiles", {"NORM_BWD_ROWS": False, "NORM_BWD_TILES": 4}),
    ("tile, 16 tiles", {"NORM_BWD_ROWS": False, "NORM_BWD_TILES": 16}),
    ("tile, 2048 elems, 2 warps", {"NORM_BWD_ROWS": False, "NORM_BWD_TILE_ELEMS": 2048, "NORM_BWD_WARPS": 2}),
]
BWD_CASES = {  # name -> (x shape, weight dtype, gated, with the stream's gradient)
    "RMSNorm [32768, 768]": ((M, 768), torch.bfloat16, False, False),
    "add + RMSNorm [32768, 768] (stream gradient)": ((M, 768), torch.bfloat16, False, True),
    "gated RMSNorm [196608, 128]": ((M * 6, 128), torch.float32, True, False),
}


def bwd_sweep(copy_gbps: float) -> dict:
    """GPU time (CUDA graph replays) of ``norm_triton.norm_bwd`` alone at the small model's bf16 shapes under each
    of :data:`BWD_SETTINGS`, with the largest relative RMS difference of its outputs from the tile kernel's."""
    from kernels.benchmarks.constants import overridden
    from kernels.norm import norm_triton as nt

    out = {}
    for name, (shape, w_dtype, gated, stream) in BWD_CASES.items():
        g = torch.Generator(device="cuda").manual_seed(1)
        x, dy, gate, ds = (torch.randn(shape, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
        w = (1 + 0.1 * torch.randn(shape[-1], device="cuda", generator=g)).to(w_dtype)
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
        args = (x, gate if gated else None, w, rstd, dy, ds if stream else None)
        moved = sum(t.numel() * t.element_size() for t in (x, dy, x) + ((gate, gate) if gated else ())
                    + ((ds,) if stream else ()))
        rows, ref = {}, None
        for setting, consts in BWD_SETTINGS:
            with overridden([(nt, k, v) for k, v in consts.items()]):
                got = [t for t in nt.norm_bwd(*args) if t is not None]
                ms = bench_graph(lambda args=args: nt.norm_bwd(*args))
            ref = ref or got
            rows[setting] = {"ms": round(ms, 4), "frac_of_copy": round(moved / ms / 1e6 / copy_gbps, 3),
                             "max_rel_diff": max(rel_rms(a.float(), b.float()) for a, b in zip(got, ref))}
        out[name] = rows
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_norm.json"))
    ap.add_argument("--bwd-sweep", action="store_true", help="only the RMSNorm backward's launch settings "
                    "(BWD_SETTINGS) at the model's shapes, CUDA-graph timed")
    args = ap.parse_args()
    copy_gbps = copy_bandwidth()
    if args.bwd_sweep:
        res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "copy_GBps": round(copy_gbps, 1),
               "date": datetime.date.today().isoformat(), "bwd_sweep": bwd_sweep(copy_gbps)}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
        print(f"{res['device']}, copy {copy_gbps:.0f} GB/s: RMSNorm backward alone (CUDA graph), ms / % of copy")
        for name, rows in res["bwd_sweep"].items():
            print(f"| {name} | " + " | ".join(f"{k}: {r['ms']:.4f} ({r['frac_of_copy']:.0%}, diff {r['max_rel_diff']:.0e})"
                                              for k, r in rows.items()) + " |")
        return
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "date": datetime.date.today().isoformat(), "copy_GBps": round(copy_gbps, 1), "cases": {}}
    for name, spec in CASES.items():
        results["cases"][name] = case(*spec, copy_gbps)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"{results['device']}, copy {copy_gbps:.0f} GB/s, {results['date']}")
    print("GPU time (CUDA graph replay); eager = with the host's work")
    print("| case | fused fwd / fwd+bwd ms | torch fwd / fwd+bwd ms | fused fwd+bwd % of copy | speedup | "
          "fused eager fwd+bwd ms | err y fused / torch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results["cases"].items():
        t, p = r["triton"], r["torch"]
        print(f"| {name} | {t['fwd_ms']:.3f} / {t['fwd_bwd_ms']:.3f} | {p['fwd_ms']:.3f} / {p['fwd_bwd_ms']:.3f} | "
              f"{t['fwd_bwd_frac_of_copy']:.0%} | {r['speedup_fwd_bwd']}x | {t['eager_fwd_bwd_ms']:.3f} | "
              f"{t['err_y']:.1e} / {p['err_y']:.1e} |")


if __name__ == "__main__":
    main()
