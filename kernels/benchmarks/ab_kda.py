"""GPU A/B of one KDA setting against the default, with fla-core as the peer, in one process.

A setting is a set of ``kernels.kda.chunk_triton`` / ``chunk_triton_bwd`` module constants. For each shape: the
training-path forward and forward + backward of ours with the default constants and with the setting (bf16,
K = V = 128, Kimi Linear flags, inputs requiring grad; median of ``triton.testing.do_bench``, the two taken in
turn ``--rounds`` times), fla's in the same run, the peak extra memory of a step, and one step's per-kernel times
of both settings. JSON to ``$OUT/ab_kda.json`` and a table.

    python kernels/benchmarks/ab_kda.py --set SCORES2_BK=32 --shapes 1x8192x32 4x4096x32
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
    bench,
    call,
    kda_constants,
    kernel_ms,
    make,
    parse_constants,
    peak_extra_gib,
)


def _measure(impl: str, xs, do) -> dict:
    step = lambda: torch.autograd.backward(call(impl, xs)[0], do)  # noqa: E731
    fwd, fb = bench(lambda: call(impl, xs)), bench(step)
    return {"fwd_ms": fwd, "fwdbwd_ms": fb, "peak_extra_GiB": peak_extra_gib(step, xs)}


def run_shape(shape: str, setting: dict, rounds: int, fla: bool) -> dict:
    B, T, H = (int(x) for x in shape.split("x"))
    xs = make(B, T, H, grad=True)
    do = torch.randn(B, T, H, V, dtype=torch.bfloat16, device="cuda")
    res: dict = {"default": [], "setting": []}
    for _ in range(rounds):
        res["default"].append(_measure("ours", xs, do))
        with kda_constants(setting):
            res["setting"].append(_measure("ours", xs, do))
    step = lambda: torch.autograd.backward(call("ours", xs)[0], do)  # noqa: E731
    res["default_kernels_ms"] = kernel_ms(step, 3)
    with kda_constants(setting):
        step()
        res["setting_kernels_ms"] = kernel_ms(step, 3)
    if fla:
        try:
            res["fla"] = _measure("fla", xs, do)
        except Exception as e:  # noqa: BLE001 - no fla: the A/B still stands
            res["fla_error"] = repr(e)[:300]
    return res


def _best(runs: list[dict], key: str) -> float:
    return min(r[key] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", nargs="+", required=True, help="NAME=VALUE constants of the setting")
    ap.add_argument("--shapes", nargs="+", default=["1x8192x32"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-fla", action="store_true")
    args = ap.parse_args()
    setting = parse_constants(args.set, "ab_kda --set")
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "setting": args.set, "shapes": {}}
    path = os.path.join(os.environ.get("OUT", "."), "ab_kda.json")
    t0 = time.time()
    for shape in args.shapes:
        out["shapes"][shape] = run_shape(shape, setting, args.rounds, not args.no_fla)
        json.dump(out, open(path, "w"), indent=1)
    out["elapsed_s"] = time.time() - t0
    json.dump(out, open(path, "w"), indent=1)
    print(f"setting: {' '.join(args.set)} (best of {args.rounds} rounds each)")
    print("| shape | default fwd / fwd+bwd ms | setting fwd / fwd+bwd ms | fla fwd / fwd+bwd ms | "
          "peak GiB default / setting / fla |\n| --- | --- | --- | --- | --- |")
    for shape, r in out["shapes"].items():
        d, s, f = r["default"], r["setting"], r.get("fla")
        fla = f"{f['fwd_ms']:.3f} / {f['fwdbwd_ms']:.3f}" if f else r.get("fla_error", "-")[:40]
        peak = f"{d[0]['peak_extra_GiB']:.2f} / {s[0]['peak_extra_GiB']:.2f} / " + (f"{f['peak_extra_GiB']:.2f}"
                                                                                  if f else "-")
        print(f"| {shape} | {_best(d, 'fwd_ms'):.3f} / {_best(d, 'fwdbwd_ms'):.3f} | {_best(s, 'fwd_ms'):.3f} / "
              f"{_best(s, 'fwdbwd_ms'):.3f} | {fla} | {peak} |")


if __name__ == "__main__":
    main()
