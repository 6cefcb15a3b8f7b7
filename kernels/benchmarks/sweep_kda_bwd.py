"""GPU sweep of the KDA backward's launch settings (``chunk_triton_bwd.BWD_LAUNCH`` and tile constants).

For each setting: the backward alone (``torch.autograd.grad`` with ``retain_graph``, median of
``triton.testing.do_bench``) of the training path at bf16, K = V = 128, Kimi Linear flags, and the largest
relative RMS difference of its gradients from the default setting's (the same maths, so only rounding may
differ) and its errors against fp64 at a small shape (``bench_kda.correctness``). Then a per-kernel profile
of one training step with the default. Writes ``$OUT/sweep_kda_bwd.json`` and prints a table.

    python kernels/benchmarks/sweep_kda_bwd.py --shape 1x8192x32
    python kernels/benchmarks/sweep_kda_bwd.py --shape 8x4096x6 --gates init   # the small hybrid's shape and gates
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kernels.benchmarks.bench_kda import (  # noqa: E402
    V,
    add_gates_arg,
    bench,
    call,
    correctness,
    kda_constants,
    make,
    profile_step,
    rel,
    use_gates,
)
from kernels.kda import chunk_triton_bwd as cb  # noqa: E402

# (name, {module constant: value}, {launch key: (num_warps, num_stages)})
SETTINGS = [
    ("default", {}, {}),
    ("diag pairwise", {"BWD_SPAN_MAX": -1.0}, {}),
    ("inter ee scan", {"BWD_EE_FROM_G": "never"}, {}),
    ("diag ieee", {"BWD_DIAG_PREC16": "ieee"}, {}),
    ("diag tf32", {"BWD_DIAG_PREC16": "tf32"}, {}),
    ("pair w2", {}, {"pair": (2, 1)}),
    ("pair w1", {}, {"pair": (1, 1)}),
    ("pair w2 s2", {}, {"pair": (2, 2)}),
    ("pair w2 bk64", {"BWD_PAIR_BK": 64}, {"pair": (2, 1)}),
    ("pair w4 bk64", {"BWD_PAIR_BK": 64}, {"pair": (4, 1)}),
    ("pair w2 bk16", {"BWD_PAIR_BK": 16}, {"pair": (2, 1)}),
    ("state s3", {}, {"state": (4, 3)}),
    ("state bv16", {"BWD_STATE_BV": 16}, {}),
    ("state bv64", {"BWD_STATE_BV": 64}, {}),
    ("state bv32", {"BWD_STATE_BV": 32}, {}),
    ("dy s2", {}, {"dy": (4, 2)}),
    ("dy s3", {}, {"dy": (4, 3)}),
    ("inter w4 s2", {}, {"inter": (4, 2)}),
    ("inter w4 s1", {}, {"inter": (4, 1)}),
    ("inter w4 bk64", {"BWD_INTER_BK": 64}, {}),
    ("pair w4 s2", {}, {"pair": (4, 2)}),
    ("pair w8", {}, {"pair": (8, 1)}),
    ("inter w8", {}, {"inter": (8, 2)}),
    ("inter bk16", {"BWD_INTER_BK": 16}, {}),
    ("inter bv32", {"BWD_INTER_BV": 32}, {}),
    ("pair w2 bk64 unroll 1", {"BWD_PAIR_BK": 64, "BWD_PAIR_UNROLL": (1, 1)}, {"pair": (2, 1)}),
    ("pair w2 bk64 unroll 4", {"BWD_PAIR_BK": 64, "BWD_PAIR_UNROLL": (4, 4)}, {"pair": (2, 1)}),
    ("pair w1 bk64", {"BWD_PAIR_BK": 64}, {"pair": (1, 1)}),
    ("pair unroll 1", {"BWD_PAIR_UNROLL": (1, 1)}, {}),
    ("pair unroll 2", {"BWD_PAIR_UNROLL": (2, 2)}, {}),
    ("pair unroll 4", {"BWD_PAIR_UNROLL": (4, 4)}, {}),
    ("state dh32", {"BWD_DH_16BIT": False}, {}),
    ("dvn32", {"BWD_DVN_16BIT": False}, {}),
    ("dy bv64", {"BWD_DY_BV": 64}, {}),
    ("dy w8", {}, {"dy": (8, 2)}),
    ("inter bv128", {"BWD_INTER_BV": 128}, {}),
    ("inter w8 bv128", {"BWD_INTER_BV": 128}, {"inter": (8, 2)}),
    ("call6 default", {"BWD_STATE_FILL": 1.0}, {"dy": (4, 2), "inter": (4, 2)}),  # before session 27 call6
    ("inter w2", {}, {"inter": (2, 3)}),
    ("inter w2 bk64", {"BWD_INTER_BK": 64}, {"inter": (2, 3)}),
    ("inter w8 bk64", {"BWD_INTER_BK": 64}, {"inter": (8, 3)}),
    ("inter w2 bv32", {"BWD_INTER_BV": 32}, {"inter": (2, 3)}),
    ("dy w2", {}, {"dy": (2, 1)}),
    ("dy w2 bv64", {"BWD_DY_BV": 64}, {"dy": (2, 1)}),
    ("state w2", {}, {"state": (2, 2)}),
    ("state w8", {}, {"state": (8, 2)}),
    ("default again", {}, {}),  # the default timed again after the others: how far the first timing drifted
]


def run_setting(consts: dict, launch: dict, xs, do, ref) -> dict:
    saved_launch = dict(cb.BWD_LAUNCH)
    try:
        cb.BWD_LAUNCH.update(launch)
        with kda_constants(consts):
            o = call("ours", xs)[0]
            grads = torch.autograd.grad(o, xs[:5], do, retain_graph=True)
            diff = max(rel(a, b) for a, b in zip(grads, ref)) if ref is not None else 0.0
            ms = bench(lambda: torch.autograd.grad(o, xs[:5], do, retain_graph=True))
            errs = correctness(["ours"])["ours"]
        return {"bwd_ms": ms, "max_rel_diff_vs_default": diff, "errors_vs_fp64": errs}, grads
    finally:
        cb.BWD_LAUNCH.clear()
        cb.BWD_LAUNCH.update(saved_launch)


def _errors(e: dict) -> str:
    """A row of ``correctness``'s errors (o dq dk dv dg dbeta), or its error message."""
    if "error" in e:
        return e["error"][:80]
    return " ".join(f"{e[k]:.1e}" for k in ("o", "dq", "dk", "dv", "dg", "dbeta"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1x8192x32")
    ap.add_argument("--only", default="", help="comma-separated setting names (default: all)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "sweep_kda_bwd.json"))
    ap.add_argument("--fla-errors", action="store_true", help="also fla's errors against fp64 (bench_kda.correctness)")
    add_gates_arg(ap)
    args = ap.parse_args()
    use_gates(args.gates, args.beta)
    B, T, H = (int(x) for x in args.shape.split("x"))
    xs = make(B, T, H, grad=True)
    do = torch.randn(B, T, H, V, dtype=torch.bfloat16, device="cuda")
    res: dict = {"gpu": torch.cuda.get_device_name(), "shape": args.shape, "gates": args.gates, "beta": args.beta,
                 "settings": {}}
    ref = None
    t0 = time.time()
    only = {s for s in args.only.split(",") if s}
    for name, consts, launch in SETTINGS:
        if only and name not in only and name != "default":
            continue
        try:
            res["settings"][name], grads = run_setting(consts, launch, xs, do, ref)
            ref = grads if ref is None else ref
        except Exception as e:  # noqa: BLE001 - a failed compile is a result too
            res["settings"][name] = {"error": repr(e)[:300]}
        res["settings"][name] |= {"consts": consts, "launch": {k: list(v) for k, v in launch.items()}}
        json.dump(res, open(args.out, "w"), indent=1)
    if args.fla_errors:
        res["fla_errors_vs_fp64"] = correctness(["fla"])["fla"]
    res["default_step_kernels_ms"] = profile_step("ours", B, T, H)
    res["elapsed_s"] = time.time() - t0
    json.dump(res, open(args.out, "w"), indent=1)
    print(f"{'setting':>20} {'bwd ms':>8} {'max rel diff':>12}  errors vs fp64 (o dq dk dv dg dbeta)")
    for name, r in res["settings"].items():
        if "error" in r:
            print(f"{name:>20} {r['error'][:80]}")
        else:
            print(f"{name:>20} {r['bwd_ms']:8.3f} {r['max_rel_diff_vs_default']:12.2e}  {_errors(r['errors_vs_fp64'])}")
    if "fla_errors_vs_fp64" in res:
        print(f"{'fla':>20} {'':>8} {'':>12}  {_errors(res['fla_errors_vs_fp64'])}")
    print(json.dumps(dict(list(res["default_step_kernels_ms"].items())[:12]), indent=0))


if __name__ == "__main__":
    main()
