"""GPU time of the two-phase AttnRes decode kernels alone (``kernels/attn_res/two_phase_triton.py``), by layout and
warp count, against the standard residual's add and norm, with host launch overhead removed
(``triton.testing.do_bench_cudagraph``). JSON to ``$OUT/bench_two_phase.json`` and a table.

    python kernels/benchmarks/bench_two_phase.py --d 768 --slots 5 --queries 6 --tokens 1 8 64
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from triton.testing import do_bench_cudagraph

from kernels.attn_res import two_phase_triton as tp


def _time(fn) -> float:
    return 1e3 * do_bench_cudagraph(fn, rep=50)


def bench(d: int, slots: int, queries: int, tokens: int) -> list[dict]:
    """Phase 1 (``slots`` completed slots, the pending output completing the last one from a running sum in a slot
    of its own, as ``BufferedTwoPhase`` lays them out) by layout, query programs and warps; phase 2 by warps, with
    and without the input RMSNorm applied in the kernel; a ``torch.add`` and the fused add + RMSNorm (the standard
    residual's decode step) for scale. Phase 2 also by rows per program (the tiled layout's, or
    ``PHASE2_DECODE_ROWS = 1``), the norms by rows per program and warps."""
    from kernels.norm import add_rms_norm, rms_norm
    from kernels.norm import norm_triton as nt

    gen = torch.Generator(device="cuda").manual_seed(0)
    v = torch.randn(slots + 1, tokens, d, device="cuda", generator=gen).to(torch.bfloat16)
    u = torch.randn(4 * queries + 1, d, device="cuda", generator=gen)
    pend = torch.randn(tokens, d, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.empty(tokens, d, device="cuda", dtype=torch.bfloat16)
    gain = torch.rand(d, device="cuda", generator=gen).to(torch.bfloat16) + 0.5
    rows = []
    configs = [("rows", w, par) for w in (2, 4, 8) for par in (False, True)] + [("tiled", tp.NUM_WARPS, False)]
    for layout, warps, par in configs:
        old = (tp.ROWS_MAX_TOKENS, tp.ROWS_NUM_WARPS, tp.ROWS_QUERY_PROGRAMS)
        tp.ROWS_MAX_TOKENS, tp.ROWS_NUM_WARPS = (1 << 30 if layout == "rows" else 0), warps
        tp.ROWS_QUERY_PROGRAMS = par
        try:
            run = tp.TwoPhaseLauncher(v, u, queries)
        finally:
            tp.ROWS_MAX_TOKENS, tp.ROWS_NUM_WARPS, tp.ROWS_QUERY_PROGRAMS = old
        name = layout + (" per query" if par else "")
        for n_q in sorted({1, queries}):
            for norm in (None, (gain, 1e-6)):
                us = _time(lambda run=run, n_q=n_q, norm=norm: run.phase1(slots, 0, n_q, 1e-6, pend, False, out,
                                                                          norm, src_slot=slots))
                rows.append({"kernel": "phase1" + (" + norm" if norm else ""), "layout": name, "warps": warps,
                             "tokens": tokens, "n_q": n_q, "us": us})
    for warps in (1, 2, 4, 8):
        for rows_per_prog in (0, 1):
            old = (tp.PHASE2_NUM_WARPS, tp.PHASE2_DECODE_ROWS)
            tp.PHASE2_NUM_WARPS, tp.PHASE2_DECODE_ROWS = warps, rows_per_prog
            try:
                run = tp.TwoPhaseLauncher(v, u, queries)
            finally:
                tp.PHASE2_NUM_WARPS, tp.PHASE2_DECODE_ROWS = old
            run.phase1(slots, 0, queries, 1e-6, pend, True, out)
            for norm in (None, (gain, 1e-6)):
                us = _time(lambda run=run, norm=norm: run.phase2(1, slots, 1, 1e-6, pend, False, out, norm))
                rows.append({"kernel": "phase2" + (" + norm" if norm else ""), "layout": f"{run.p2_block_t} rows",
                             "warps": warps, "tokens": tokens, "n_q": 1, "us": us})
    x = v[0]
    with torch.no_grad():
        rows.append({"kernel": "torch.add", "layout": "-", "warps": 0, "tokens": tokens, "n_q": 0,
                     "us": _time(lambda: torch.add(x, pend, out=out))})
        for few_rows, warps in ((0, nt.NORM_WARPS), (64, 4), (64, 8)):  # the row tile, or one row a program
            old = (nt.NORM_FEW_ROWS, nt.NORM_FEW_ROWS_WARPS)
            nt.NORM_FEW_ROWS, nt.NORM_FEW_ROWS_WARPS = few_rows, warps
            try:
                layout = f"{nt._fwd_launch(tokens, d)[0]} rows"
                for name, fn in (("rms_norm", lambda: rms_norm(x, gain, 1e-6)),
                                 ("add_rms_norm", lambda: add_rms_norm(x, pend, gain, 1e-6))):
                    rows.append({"kernel": name, "layout": layout, "warps": warps, "tokens": tokens, "n_q": 0,
                                 "us": _time(fn)})
            finally:
                nt.NORM_FEW_ROWS, nt.NORM_FEW_ROWS_WARPS = old
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--slots", type=int, default=5)
    p.add_argument("--queries", type=int, default=6)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64])
    args = p.parse_args()
    rows = [r for m in args.tokens for r in bench(args.d, args.slots, args.queries, m)]
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_two_phase.json").write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                              "args": vars(args), "rows": rows}, indent=2))
    print("| kernel | layout | warps | tokens | queries | us |\n| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['kernel']} | {r['layout']} | {r['warps']} | {r['tokens']} | {r['n_q']} | {r['us']:.2f} |")


if __name__ == "__main__":
    main()
