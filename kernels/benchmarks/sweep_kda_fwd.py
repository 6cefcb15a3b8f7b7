"""GPU sweep of the KDA forward's launch settings and tile constants (``chunk_triton``'s module constants).

For each setting: the training-path forward (bf16 inputs requiring grad, K = V = 128, Kimi Linear flags; median
of ``triton.testing.do_bench``), the per-kernel times of that forward (torch.profiler), and the relative RMS
difference of its output from the default setting's (the same maths, so only rounding may differ; the
``pairwise`` setting computes the diagonal blocks the other way) and the error of o against fp64 at a small shape
(``bench_kda.correctness``). fla-core's forward is timed in the same run when
it is installed. Writes ``$OUT/sweep_kda_fwd.json`` after every setting and prints a table.

    python kernels/benchmarks/sweep_kda_fwd.py --shape 1x8192x32
    python kernels/benchmarks/sweep_kda_fwd.py --shape 8x4096x6 --gates init   # the small hybrid's shape and gates
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kernels.benchmarks.bench_kda import (  # noqa: E402
    add_gates_arg,
    bench,
    call,
    correctness,
    graph_ms,
    host_ms,
    kda_constants,
    kernel_ms,
    make,
    rel,
    use_gates,
)

# (name, {chunk_triton constant: value})
SETTINGS = [
    ("default", {}),
    ("diag ieee", {"INTRA_DIAG_PREC16": "ieee"}),
    ("diag tf32", {"INTRA_DIAG_PREC16": "tf32"}),
    ("scores nreg255", {"SCORES2_MAXNREG": 255}),
    ("diag pairwise", {"INTRA_SPAN_MAX": -1.0}),
    ("scores s2", {"SCORES2_LAUNCH": (4, 2)}),
    ("scores nreg192", {"SCORES2_MAXNREG": 192}),
    ("scores nreg128", {"SCORES2_MAXNREG": 128}),
    ("scores tf32x3", {"INTRA_PREC16": "tf32x3"}),
    ("scores w8 nreg128", {"SCORES2_LAUNCH": (8, 3), "SCORES2_MAXNREG": 128}),
    ("scores bk32", {"SCORES2_BK": 32}),
    ("scores bk32 s2", {"SCORES2_BK": 32, "SCORES2_LAUNCH": (4, 2)}),
    ("scores bk32 nreg192", {"SCORES2_BK": 32, "SCORES2_MAXNREG": 192}),
    ("wu 64", {"WU_B": 64}),
    ("scores s1", {"SCORES2_LAUNCH": (4, 1)}),
    ("scores s4", {"SCORES2_LAUNCH": (4, 4)}),
    ("state s2", {"STATE_LAUNCH": (4, 2)}),
    ("state s4", {"STATE_LAUNCH": (4, 4)}),
    ("state bv16", {"STATE_BV": 16}),
    ("state bv32", {"STATE_BV": 32}),
    ("state w2", {"STATE_LAUNCH": (2, 3)}),
    ("state bv64", {"STATE_BV": 64}),
    ("state bv64 w8 s3", {"STATE_BV": 64, "STATE_LAUNCH": (8, 3)}),
    ("prep chunks first", {"PREP_HEADS_FIRST": False}),
    ("scores chunks first", {"SCORES2_HEADS_FIRST": False}),
    ("output chunks first", {"OUT_HEADS_FIRST": False}),
    ("all chunks first", {"PREP_HEADS_FIRST": False, "SCORES2_HEADS_FIRST": False, "OUT_HEADS_FIRST": False}),
    ("prep s1", {"PREP_LAUNCH": (4, 1)}),
    ("prep s3", {"PREP_LAUNCH": (4, 3)}),
    ("prep bk64", {"PREP_BK": 64}),
    ("prep w8", {"PREP_LAUNCH": (8, 2)}),
    ("prep bk64 w8", {"PREP_BK": 64, "PREP_LAUNCH": (8, 2)}),
    ("prep bk16", {"PREP_BK": 16}),
    ("scores diag substitution", {"SCORES2_DIAG_INV": 0}),
    ("default again", {}),
    ("out bv128 w8", {"OUT_BV": 128, "OUT_WARPS": 8}),
    ("state fill 1", {"STATE_FILL": 1.0}),
    ("state bv64 s2", {"STATE_BV": 64, "STATE_LAUNCH": (4, 2)}),
    ("state bv64 s4", {"STATE_BV": 64, "STATE_LAUNCH": (4, 4)}),
    ("state bv16 s2", {"STATE_BV": 16, "STATE_LAUNCH": (4, 2)}),
    ("state bv16 s1", {"STATE_BV": 16, "STATE_LAUNCH": (4, 1)}),
    ("state bv64 s1", {"STATE_BV": 64, "STATE_LAUNCH": (4, 1)}),
    # session 38 (the norms in the scores kernel's loop, now the default): the prep kernel's norms; and 3 stages
    ("norms prep", {"SCORES2_NORMS": False}),
    ("scores norms s3", {"SCORES2_NORMS_STAGES": 3}),
    # session 39: the forward in pieces along time, each piece's state pass beside the next piece's scores (pieces.py);
    # "pieces N" at the pieces' own state width (pieces.PIECE_STATE_BV, 32), "bvX" another (call2's "pieces N" ran at
    # the one-piece width, 16 there: "pieces N bv16" here)
    # (since session 42 "pieces N" are near-equal pieces whatever pieces.PIECE_WEIGHTS says)
    *((f"pieces {n}", {"FWD_PIECES": n, "PIECE_WEIGHTS": {}}) for n in (2, 3, 4, 5, 6, 8)),
    *((f"pieces {n} bv{bv}", {"FWD_PIECES": n, "STATE_BV": bv}) for n in (2, 4, 8, 16) for bv in (16, 64)),
    ("pieces 4 s2", {"FWD_PIECES": 4, "STATE_LAUNCH": (4, 2)}),
    ("pieces 4 bv16 s2", {"FWD_PIECES": 4, "STATE_BV": 16, "STATE_LAUNCH": (4, 2)}),
    ("pieces auto", {"FWD_PIECES": None}),
    # session 42: unequal pieces (pieces.PIECE_WEIGHTS, first to last), larger early ones
    *((f"pieces {len(w)} w{':'.join(map(str, w))}", {"FWD_PIECES": len(w), "PIECE_WEIGHTS": {len(w): tuple(map(float, w))}})
      for w in ((3, 2), (2, 1), (7, 3), (3, 1), (4, 1), (5, 1), (6, 1), (8, 1), (2, 1, 1), (3, 2, 1), (5, 3, 2),
                (4, 3, 2, 1), (3, 3, 2, 1), (2, 2, 1, 1), (4, 4, 3, 2), (6, 3, 2, 1))),
]


def run_setting(consts: dict, xs, ref, graph: bool = False) -> tuple[dict, torch.Tensor]:
    with kda_constants(consts):
        o = call("ours", xs)[0].detach()
        ms = bench(lambda: call("ours", xs))
        graphed = {"fwd_graph_ms": graph_ms(lambda: call("ours", xs))} if graph else {}
        host = host_ms(lambda: call("ours", xs))
        kernels = kernel_ms(lambda: call("ours", xs), 5)
        diff = rel(o, ref) if ref is not None else 0.0
        errs = correctness(["ours"])["ours"]
    return {
        "fwd_ms": ms,
        "fwd_host_ms": host,
        "rel_diff_vs_default": diff,
        "o_err_vs_fp64": errs.get("o"),
        "kernels_ms": kernels,
    } | graphed, o


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1x8192x32")
    ap.add_argument("--only", default="", help="comma-separated setting names (default: all)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "sweep_kda_fwd.json"))
    ap.add_argument("--best-out", default=None, help="write the fastest setting within 2%% of the lowest o error")
    ap.add_argument("--no-fla", action="store_true", help="skip fla (it autotunes for minutes at a new head count)")
    ap.add_argument("--graph", action="store_true", help="also each forward replayed as a CUDA graph (fwd_graph_ms)")
    add_gates_arg(ap)
    args = ap.parse_args()
    use_gates(args.gates, args.beta)
    B, T, H = (int(x) for x in args.shape.split("x"))
    xs = make(B, T, H, grad=True)
    res: dict = {"gpu": torch.cuda.get_device_name(), "shape": args.shape, "gates": args.gates, "beta": args.beta,
                 "settings": {}}
    try:
        if args.no_fla:
            raise RuntimeError("skipped: --no-fla")
        call("fla", xs)
        res["fla_fwd_ms"] = bench(lambda: call("fla", xs))
        res["fla_fwd_host_ms"] = host_ms(lambda: call("fla", xs))
        res["fla_fwd_kernels_ms"] = kernel_ms(lambda: call("fla", xs), 5)
        if args.graph:
            res["fla_fwd_graph_ms"] = graph_ms(lambda: call("fla", xs))
    except Exception as e:  # noqa: BLE001 - no fla: the sweep still runs
        res["fla_error"] = repr(e)[:300]
    only = {s for s in args.only.split(",") if s}
    ref = None
    t0 = time.time()
    for name, consts in SETTINGS:
        if only and name not in only and name != "default":
            continue
        try:
            res["settings"][name], o = run_setting(consts, xs, ref, args.graph)
            ref = o if ref is None else ref
        except Exception as e:  # noqa: BLE001 - a failed compile is a result too
            res["settings"][name] = {"error": repr(e)[:300]}
        res["settings"][name]["consts"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in consts.items()}
        json.dump(res, open(args.out, "w"), indent=1)
    res["elapsed_s"] = time.time() - t0
    ok = {n: r for n, r in res["settings"].items()  # timed, with a finite error against fp64 (a NaN one is out)
          if "fwd_ms" in r and isinstance(r["o_err_vs_fp64"], float) and math.isfinite(r["o_err_vs_fp64"])}
    if ok:
        floor = min(r["o_err_vs_fp64"] for r in ok.values())
        best = min((n for n, r in ok.items() if r["o_err_vs_fp64"] <= 1.02 * floor), key=lambda n: ok[n]["fwd_ms"])
        res["best"] = best
        if args.best_out:
            with open(args.best_out, "w") as f:
                f.writelines(f"{k}={v!r}\n" for k, v in dict(SETTINGS)[best].items())
    json.dump(res, open(args.out, "w"), indent=1)
    print(
        f"best: {res.get('best')}; fla fwd ms: {res.get('fla_fwd_ms', res.get('fla_error'))}, host ms {res.get('fla_fwd_host_ms')}"
        f", as a CUDA graph {res.get('fla_fwd_graph_ms')}"
    )
    print(f"fla fwd kernels: {json.dumps(res.get('fla_fwd_kernels_ms'))}")
    short = {"_prep_kernel": "prep", "_scores2_kernel": "scores2", "_state_kernel": "state",
             "_output_kernel": "out"}
    fla_graph = res.get("fla_fwd_graph_ms")
    print(f"{'setting':>22} {'fwd ms':>7} {'graph ms':>8} {'/fla':>6} {'rel diff':>9} {'o err':>8} "
          + " ".join(f"{v:>8}" for v in short.values()))
    for name, r in res["settings"].items():
        if "error" in r:
            print(f"{name:>22} {r['error'][:100]}")
            continue
        ks = " ".join(f"{r['kernels_ms'].get(k, float('nan')):8.3f}" for k in short)
        g = r.get("fwd_graph_ms")
        g_txt = f"{g:8.3f}" if isinstance(g, float) else f"{'-':>8}"
        ratio = f"{g / fla_graph:6.3f}" if isinstance(g, float) and isinstance(fla_graph, float) else f"{'-':>6}"
        print(f"{name:>22} {r['fwd_ms']:7.3f} {g_txt} {ratio} {r['rel_diff_vs_default']:9.2e} "
              f"{r['o_err_vs_fp64']:8.2e} {ks}")


if __name__ == "__main__":
    main()
