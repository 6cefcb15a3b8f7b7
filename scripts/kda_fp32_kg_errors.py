"""fp32 errors of the chunked KDA forward against the fp64 token loop, with kg's exponent G_last - G taken as a
difference of the stored fp32 prefix sums (qg / kg written by the scores kernel's W / U loop) or as a suffix sum
of g in the prep kernel (session 19's kernels). Run from a tree at commit d289dcf, which has both
(``QGKG_IN_WU``); prints the relative RMS errors of o and the final state per gate kind, shape and h0.

    python scripts/kda_fp32_kg_errors.py --seeds 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "kernels"))

from kda_cases import GATES, make_inputs  # noqa: E402

from kernels.kda import chunk_kda  # noqa: E402
from kernels.kda import chunk_triton as ct  # noqa: E402
from kernels.kda.naive import naive_recurrent_kda  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).pow(2).mean().sqrt() / b.double().pow(2).mean().sqrt()).item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "kda_fp32_kg_errors.json"))
    args = ap.parse_args()
    if not hasattr(ct, "QGKG_IN_WU"):
        sys.exit("this tree's kernels have one form only: run from `git archive d289dcf` (see the docstring)")
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: run with TRITON_INTERPRET=1
    rows = []
    for seed in range(args.seeds):
        for T, D, H, HV in [(64, 64, 1, 1), (63, 128, 1, 1), (1000, 128, 4, 4), (65, 100, 2, 8)]:
            for gate in GATES:
                for h0 in (False, True):
                    torch.manual_seed(seed)
                    q, k, v, g, beta, s0 = make_inputs(1, T, H, HV, D, D, gate=gate, h0=h0)
                    ref = naive_recurrent_kda(*(None if t is None else t.to(dev) for t in (q, k, v, g, beta)),
                                              initial_state=None if s0 is None else s0.to(dev),
                                              output_final_state=True)
                    x = [None if t is None else t.to(dev, torch.float32) for t in (q, k, v, g, beta, s0)]
                    row = dict(seed=seed, T=T, D=D, H=H, HV=HV, gate=gate, h0=h0)
                    for name, flag in (("suffix", False), ("difference", True)):
                        ct.QGKG_IN_WU = flag
                        o, S = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True, backend="triton")
                        row[name] = (rel(o, ref[0]), rel(S, ref[1]))
                    rows.append(row)
                    print(f"{seed} {T:5d} {D:4d} {H}/{HV} {gate:>13} h0={h0!s:5}  o {row['suffix'][0]:.2e} / "
                          f"{row['difference'][0]:.2e}   S {row['suffix'][1]:.2e} / {row['difference'][1]:.2e}")
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "rows": rows}, f, indent=1)
    for i, name in enumerate(("o", "S")):
        for form in ("suffix", "difference"):
            print(f"max {name} error, {form}: {max(r[form][i] for r in rows):.2e}")


if __name__ == "__main__":
    main()
