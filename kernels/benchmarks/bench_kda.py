"""GPU benchmark of the KDA kernels against fla-core's ``fla.ops.kda`` in the same run (issue 4).

Checks correctness on the GPU first (ours and fla vs the PyTorch chunked path in fp64 on the same bf16 inputs), then
times with ``triton.testing.do_bench`` (median) at bf16, K = V = 128, Kimi Linear flags (in-kernel L2
norm of q, k and in-kernel softplus gate): ``chunk_kda`` forward, forward+backward, the peak extra
memory of one training step, and the one-token decode (``fused_recurrent_kda``) at batch 64, H = 32.
For ours, the backward alone is also timed (``bwd_ms``, ``retain_graph``); with ``--graph``, each forward replayed
as a CUDA graph as well (``fwd_graph_ms``: device time without the host's launch cost, which made fla's forward
host-bound at some shapes in sessions 5-18). Also measures the GPU's
ceilings (device copy bandwidth, bf16 matmul rate). Writes ``$OUT/bench_kda.json`` (or ``--out``) after
every shape and prints a table.

    python kernels/benchmarks/bench_kda.py --shapes 1x8192x32,4x4096x32 --deadline 400
    python kernels/benchmarks/bench_kda.py --no-prelude --shapes 8x4096x6 --gates init   # as the small hybrid
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import json
import math
import os
import sys
import time

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kernels.benchmarks.constants import overridden  # noqa: E402
from kernels.kda import chunk_kda, fused_recurrent_kda  # noqa: E402

SHAPES = ["1x8192x32", "4x4096x32", "1x32768x16", "8x2048x16", "2x16384x16"]
K = V = 128
C = 64
# the gates' distribution (``--gates``). "bench": raw gates N(0, 1), A_log = log U(1, 16), dt_bias N(-3, 0.5^2); at
# 1x8192x32 24% of (chunk, head) pairs hold a K tile too sharp for the fast diagonal path. "init": a model's KDA layer
# at initialisation, as kimi_vl's kda_init_values draws it (dt_bias = softplus^-1(dt), dt ~ logU(1e-3, 1e-1)), raw
# gates N(0, 0.125^2), the small flavor's f_b f_a projection spread; no sharp tile (scripts/kda_gate_spans.py)
GATES = "bench"
INIT_RAW_STD = 0.125
# beta's dtype (``--beta``): bf16, or fp32 as kimi_vl's KDA layer passes it (sigmoid of the fp32 projection)
BETA_DTYPE = torch.bfloat16


def bench(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def ceilings() -> dict:
    x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm = bench(lambda: a @ a)
    return {"copy_GBps": 2 * (1 << 30) / ms / 1e6, "bf16_matmul_TFLOPs": 2 * 8192**3 / mm / 1e9}


def make(B, T, H, dev="cuda", grad=False):
    """bf16 q, k, v, raw gates, beta (``BETA_DTYPE``) and the gate's fp32 A_log, dt_bias at (B, T, H), K = V = 128
    (``GATES``)."""
    if GATES not in ("bench", "init"):
        raise ValueError(f"bench_kda.GATES must be 'bench' or 'init', got {GATES!r}")
    q, k, v = (torch.randn(B, T, H, K, dtype=torch.bfloat16, device=dev) for _ in range(3))
    raw_std = 1.0 if GATES == "bench" else INIT_RAW_STD
    g = (torch.randn(B, T, H, K, device=dev) * raw_std).to(torch.bfloat16)
    beta = torch.rand(B, T, H, device=dev).to(BETA_DTYPE)
    A_log = torch.log(torch.empty(H, device=dev).uniform_(1, 16))
    if GATES == "bench":
        dt_bias = torch.randn(H * K, device=dev) * 0.5 - 3.0
    else:
        dt = torch.empty(H * K, device=dev).uniform_(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
        dt_bias = dt + torch.log(-torch.expm1(-dt))
    xs = [q, k, v, g, beta, A_log, dt_bias]
    return [x.requires_grad_(grad) for x in xs]


def add_gates_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--gates", choices=("bench", "init"), default="bench",
                    help="the gates' distribution: the benchmark's (sharper) or a model's at initialisation")
    ap.add_argument("--beta", choices=("bf16", "fp32"), default="bf16", help="beta's dtype (the model passes fp32)")


def use_gates(name: str, beta: str = "bf16") -> None:
    """Set the gates and beta's dtype ``make`` draws for this process (the sweeps import ``make`` from here)."""
    global GATES, BETA_DTYPE
    GATES = name
    BETA_DTYPE = {"bf16": torch.bfloat16, "fp32": torch.float32}[beta]


def call(impl, xs, fn_name="chunk"):
    q, k, v, g, beta, A_log, dt_bias = xs
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    if impl == "ours":
        fn = chunk_kda if fn_name == "chunk" else fused_recurrent_kda
        return fn(q, k, v, g, beta, **kw)
    if impl == "torch":
        return chunk_kda(q, k, v, g, beta, backend="torch", **kw)
    from fla.ops.kda import chunk_kda as fla_chunk
    from fla.ops.kda import fused_recurrent_kda as fla_rec

    return (fla_chunk if fn_name == "chunk" else fla_rec)(q, k, v, g, beta, **kw)


def rel(a, b):
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())


@functools.cache
def _fp64_reference():
    """bf16 inputs at B2 T1000 H4 (fixed seed), an output gradient, and the PyTorch chunked path's o and input
    gradients in fp64 on the same bf16-rounded inputs (computed once per process: the sweeps reuse them)."""
    torch.manual_seed(1234)
    xs = make(2, 1000, 4, grad=True)
    x64 = [x.detach().double().requires_grad_() for x in xs]
    ref = call("torch", x64)[0]
    do = torch.randn_like(ref)
    return xs, do, ref.detach(), torch.autograd.grad(ref, x64, do)


def correctness(impls) -> dict:
    """Relative RMS errors of o and of every input gradient of each impl (Kimi Linear flags) against
    :func:`_fp64_reference` (the issue's yardstick: fp64 on the same bf16-rounded inputs)."""
    xs, do, ref, ref_g = _fp64_reference()
    out = {}
    for impl in impls:
        try:
            o = call(impl, xs)[0]
            gr = torch.autograd.grad(o, xs, do.to(o.dtype), allow_unused=True)
        except Exception as e:  # noqa: BLE001 - a failure is a result too
            out[impl] = {"error": repr(e)[:600]}
            continue
        names = ["dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias"]
        out[impl] = {"o": rel(o, ref)} | {
            n: (rel(a, b) if a is not None else None) for n, a, b in zip(names, gr, ref_g)
        }
    return out


def host_ms(fn, n: int = 20) -> float:
    """Mean host (CPU) milliseconds to enqueue one call of ``fn`` (no synchronisation inside the loop): when it
    approaches the do_bench time, that time measures the launch path, not the GPU."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e3
    torch.cuda.synchronize()
    return host


def graph_ms(fn) -> float | str:
    """Median milliseconds of ``fn`` replayed as a CUDA graph (no host launch cost: the device time of a call that
    is host-bound under ``do_bench``), or why it could not be captured."""
    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))
    except Exception as e:  # noqa: BLE001 - a peer that cannot be captured is recorded, not fatal
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return f"capture failed: {type(e).__name__}: {e}"[:300]


def time_shape(impl, B, T, H, graph: bool = False) -> dict:
    xs = make(B, T, H, grad=True)
    fwd = bench(lambda: call(impl, xs))
    fwd_host = host_ms(lambda: call(impl, xs))
    extra = {"fwd_graph_ms": graph_ms(lambda: call(impl, xs))} if graph else {}
    do = torch.randn(B, T, H, V, dtype=torch.bfloat16, device="cuda")
    step = lambda: torch.autograd.backward(call(impl, xs)[0], do)
    fb = bench(step)
    if impl == "ours":  # the backward alone
        o = call(impl, xs)[0]
        extra["bwd_ms"] = bench(lambda: torch.autograd.grad(o, xs, do, retain_graph=True))
        del o
    flops = B * H * (6 * T * K * K + 3 * T * C * K + T * C * C)
    res = {"fwd_ms": fwd, "fwd_host_ms": fwd_host, "fwdbwd_ms": fb, "peak_extra_GiB": peak_extra_gib(step, xs)}
    res["fwd_TFLOPs"] = flops / fwd / 1e9
    return res | extra


def peak_extra_gib(step, xs) -> float:
    """GiB allocated above what is live before one ``step()`` (the inputs' gradients cleared first)."""
    for x in xs:
        x.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def profile_fwd(B, T, H, grad=False) -> dict:
    """Mean CUDA time per kernel name of our forward (torch.profiler, 5 calls after a warm-up); ``grad``: inputs
    requiring grad (the training path: Triton L2 norm / gate functions, then the core forward)."""
    xs = make(B, T, H, grad=grad)
    call("ours", xs)
    torch.cuda.synchronize()
    return kernel_ms(lambda: call("ours", xs), 5)


def profile_step(impl, B, T, H) -> dict:
    """Mean CUDA time per kernel name of one training step (forward + backward, bf16 inputs requiring grad) of
    ``impl`` (torch.profiler, 3 steps after a warm-up): where ours and the peer spend their time, kernel by kernel."""
    xs = make(B, T, H, grad=True)
    do = torch.randn(B, T, H, V, dtype=torch.bfloat16, device="cuda")
    step = lambda: torch.autograd.backward(call(impl, xs)[0], do)
    step()
    torch.cuda.synchronize()
    return kernel_ms(step, 3)


def kernel_ms(fn, n: int) -> dict:
    """Mean CUDA ms per kernel name over ``n`` calls of ``fn`` (torch.profiler), largest first."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            out[e.key[:60]] = round(t / n / 1e3, 4)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def time_decode(impl, N=64, H=32) -> dict:
    xs = make(N, 1, H)
    state = torch.randn(N, H, K, V, device="cuda")
    q, k, v, g, beta, A_log, dt_bias = xs
    kw = dict(
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        A_log=A_log,
        dt_bias=dt_bias,
        initial_state=state,
        output_final_state=True,
    )
    if impl == "ours":
        fn = lambda: fused_recurrent_kda(q, k, v, g, beta, **kw)
    else:
        from fla.ops.kda import fused_recurrent_kda as fla_rec

        fn = lambda: fla_rec(q, k, v, g, beta, **kw)
    ms = bench(fn)
    return {"decode_us": ms * 1e3, "state_GBps": 2 * state.numel() * 4 / ms / 1e6}


def _kda_module(name: str, strict: bool = False):
    """The KDA kernel module (``chunk_triton``, ``chunk_triton_bwd``, ``prep_triton`` or ``pieces``) that defines
    constant ``name``, or None (``strict``: a KeyError naming it)."""
    from kernels.kda import chunk_triton, chunk_triton_bwd, pieces, prep_triton

    mods = (chunk_triton, chunk_triton_bwd, prep_triton, pieces)
    mod = next((m for m in mods if hasattr(m, name) and name.isupper()), None)
    if mod is None and strict:
        raise KeyError(f"no KDA kernel constant named {name!r} (chunk_triton, chunk_triton_bwd, prep_triton, pieces)")
    return mod


def parse_constants(pairs, where: str) -> dict:
    """``NAME=VALUE`` strings (Python literals) -> ``{NAME: value}``; an unknown NAME exits naming ``where``."""
    out = {}
    for pair in pairs:
        name, _, value = (x.strip() for x in pair.partition("="))
        if _kda_module(name) is None:
            raise SystemExit(f"{where}: no KDA kernel constant named {name!r}")
        out[name] = ast.literal_eval(value)
    return out


def kda_constants(consts: dict) -> contextlib.AbstractContextManager:
    """Set KDA kernel constants on the modules that define them for the ``with`` block, then restore them."""
    return overridden([(_kda_module(name, strict=True), name, value) for name, value in consts.items()])


def apply_constants(path: str) -> dict:
    """Set the ``NAME=VALUE`` lines of ``path`` (Python literals) on the KDA kernel modules that define NAME."""
    consts = parse_constants([line for line in open(path).read().splitlines() if line.strip()], path)
    for name, value in consts.items():
        setattr(_kda_module(name), name, value)
    return consts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--deadline", type=float, default=420.0, help="seconds; later shapes are skipped")
    ap.add_argument("--impls", default="ours,fla", help="comma list of ours, fla")
    ap.add_argument("--no-prelude", action="store_true", help="skip ceilings, correctness and decode")
    ap.add_argument("--prelude-impls", default=None, help="impls for correctness/decode (default: --impls)")
    ap.add_argument("--fla-shapes", default=None, help="shapes at which fla is timed (default: all of --shapes)")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="per-kernel CUDA times: our forward, and a training step of each impl, at each shape",
    )
    ap.add_argument(
        "--set-file", default=None, help="NAME=VALUE lines (sweep_kda_fwd.py --best-out): constants of ours"
    )
    ap.add_argument("--graph", action="store_true", help="also the forward replayed as a CUDA graph (fwd_graph_ms)")
    add_gates_arg(ap)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_kda.json"))
    args = ap.parse_args()
    use_gates(args.gates, args.beta)
    t0 = time.time()
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                 "gates": GATES, "beta": args.beta}
    if args.set_file:
        res["ours_constants"] = apply_constants(args.set_file)
    impls = ["ours"]
    if "fla" in args.impls.split(","):
        try:
            import fla

            res["fla"] = fla.__version__
            impls.append("fla")
        except Exception as e:  # noqa: BLE001 - record why the peer could not run
            res["fla_error"] = repr(e)
    save = lambda: json.dump(res, open(args.out, "w"), indent=1)
    pre = [i for i in impls if args.prelude_impls is None or i in args.prelude_impls.split(",")]
    fla_shapes = args.shapes.split(",") if args.fla_shapes is None else args.fla_shapes.split(",")
    if not args.no_prelude:
        res["ceilings"] = ceilings()
        res["errors_vs_fp64"] = correctness(pre)
        save()
        res["decode_B64_H32"] = {i: time_decode(i) for i in pre}
        save()
    res["shapes"] = {}
    for s in args.shapes.split(","):
        if time.time() - t0 > args.deadline:
            res["shapes"][s] = "skipped: deadline"
            continue
        B, T, H = (int(x) for x in s.split("x"))
        res["shapes"][s] = {}
        if args.profile:
            try:
                res["shapes"][s]["ours_fwd_kernels_ms"] = profile_fwd(B, T, H)
                res["shapes"][s]["ours_fwd_train_kernels_ms"] = profile_fwd(B, T, H, grad=True)
            except Exception as e:  # noqa: BLE001 - the profile is optional
                res["shapes"][s]["ours_fwd_kernels_ms"] = {"error": repr(e)[:300]}
        for impl in impls:
            if impl == "fla" and s not in fla_shapes:
                continue
            try:
                res["shapes"][s][impl] = time_shape(impl, B, T, H, graph=args.graph)
                if args.profile:
                    res["shapes"][s][f"{impl}_step_kernels_ms"] = profile_step(impl, B, T, H)
            except Exception as e:  # noqa: BLE001 - an OOM or a peer failure is a result too
                res["shapes"][s][impl] = {"error": repr(e)[:300]}
            torch.cuda.empty_cache()
            save()
    res["elapsed_s"] = time.time() - t0
    save()
    print(json.dumps(res.get("errors_vs_fp64")))
    print(f"{'shape':>12} {'impl':>5} {'fwd ms':>8} {'host ms':>8} {'f+b ms':>8} {'peak GiB':>9} {'TFLOP/s':>8}")
    for s, d in res["shapes"].items():
        for impl, r in d.items() if isinstance(d, dict) else []:
            if impl not in impls:
                top = dict(list(r.items())[:10]) if isinstance(r, dict) else r  # profiles: the 10 largest kernels
                print(f"{s:>12} {impl}: {json.dumps(top)}")
            elif "error" in r:
                print(f"{s:>12} {impl:>5} {r['error'][:60]}")
            else:
                host = r.get("fwd_host_ms", float("nan"))
                print(
                    f"{s:>12} {impl:>5} {r['fwd_ms']:8.3f} {host:8.3f} {r['fwdbwd_ms']:8.3f} "
                    f"{r['peak_extra_GiB']:9.2f} {r['fwd_TFLOPs']:8.1f}"
                )
                if "bwd_ms" in r:
                    print(f"{s:>12} {impl:>5} backward alone: {r['bwd_ms']:.3f} ms")
                if "fwd_graph_ms" in r:
                    g = r["fwd_graph_ms"]
                    print(f"{s:>12} {impl:>5} forward as a CUDA graph: " + (f"{g:.3f} ms" if isinstance(g, float) else g))
    for impl, r in res.get("decode_B64_H32", {}).items():
        print(f"decode B64 H32 {impl:>5}: {r['decode_us']:.1f} us, state {r['state_GBps']:.0f} GB/s")
    print("ceilings", res.get("ceilings"))


if __name__ == "__main__":
    main()
