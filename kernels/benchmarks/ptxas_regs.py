"""Registers and spills of the KDA forward kernels for sm_90a (H100), compiled on a machine with no GPU.

Triton lowers the kernel to PTX for a chosen target without a device; the ``ptxas`` bundled with Triton then
reports registers per thread and spill bytes (``-v``). When Triton emits a PTX ISA newer than its bundled
``ptxas`` accepts, the ``.version`` line is lowered to what that ``ptxas`` names (the kernels use no newer
instruction). Compiling the intra kernel takes about a minute on two busy cores.

    .venv/bin/python kernels/benchmarks/ptxas_regs.py --kernel intra --num-warps 8
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kernels.kda import chunk_triton as ct  # noqa: E402

SHAPE = dict(HV=32, K=128, V=128, BK=128, C=64)


def _signature(name: str) -> tuple:
    """Argument types for a bf16 run at K = V = 128 (pointers to bf16 scratch, fp32 gates/states, int32 tables)."""
    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    if name == "intra":
        args = [(n, bf) for n in "q k v g beta".split()] + [("alog", f32), ("dtb", f32), ("lb", "fp32")]
        args += [("cbos", i32), ("clen", i32)] + [(n, bf) for n in "qg kg W U Aqk".split()]
        args += [("gl", f32), ("scale", "fp32")]
        fn, extra = (
            ct._intra_kernel,
            dict(H=32, BV=128, S=16, GATE=True, LOWER=False, HAS_DTB=True, L2=True, PREC="tf32"),
        )
    elif name == "state":
        args = [(n, bf) for n in "W U kg".split()] + [("gl", f32), ("h0", f32), ("h", bf), ("vn", bf)]
        args += [("ht", f32), ("sc0", i32), ("snc", i32)]
        fn, extra = ct._state_kernel, dict(BV=ct.STATE_BV, HAS_H0=True, FP32=False)
    else:
        args = [(n, bf) for n in "qg h Aqk vn o".split()] + [("cbos", i32), ("clen", i32)]
        fn, extra = ct._output_kernel, dict(BV=ct.OUT_BV, FP32=False)
    consts = {k: v for k, v in SHAPE.items() if k in fn.arg_names} | extra
    sig = dict(zip(fn.arg_names, [t for _, t in args] + ["constexpr"] * len(consts)))
    return fn, sig, consts


def ptxas_report(name: str, num_warps: int, num_stages: int = 2) -> str:
    fn, sig, consts = _signature(name)
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    k = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    ver = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", ver)
    ptx = k.asm["ptx"]
    if m:  # CUDA 12.x's ptxas takes PTX ISA 8.x
        ptx = re.sub(r"^\.version \d+\.\d+", f".version 8.{min(int(m.group(2)), 8)}", ptx, count=1, flags=re.M)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.ptx")
        open(p, "w").write(ptx)
        r = subprocess.run(
            [ptxas, "-v", "--gpu-name=sm_90a", p, "-o", os.path.join(d, "k.o")], capture_output=True, text=True
        )
    return "\n".join(
        line.strip() for line in (r.stderr + r.stdout).splitlines() if re.search("regist|spill|rror", line)
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", choices=["intra", "state", "output"], default="intra")
    ap.add_argument("--num-warps", type=int, default=8)
    args = ap.parse_args()
    print(f"{args.kernel} num_warps={args.num_warps}\n{ptxas_report(args.kernel, args.num_warps)}")


if __name__ == "__main__":
    main()
