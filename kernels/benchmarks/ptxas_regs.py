"""Registers and spills of the KDA forward kernels for sm_90a (H100), compiled on a machine with no GPU.

Triton lowers the kernel to PTX for a chosen target without a device; the ``ptxas`` bundled with Triton then
reports registers per thread and spill bytes (``-v``). When Triton emits a PTX ISA newer than its bundled
``ptxas`` accepts, the ``.version`` line is lowered to what that ``ptxas`` names (the kernels use no newer
instruction).

    .venv/bin/python kernels/benchmarks/ptxas_regs.py                      # every forward kernel
    .venv/bin/python kernels/benchmarks/ptxas_regs.py --kernel scores2 --num-warps 8
    .venv/bin/python kernels/benchmarks/ptxas_regs.py --attnres           # the AttnRes mix kernels
    .venv/bin/python kernels/benchmarks/ptxas_regs.py --swiglu            # the SwiGLU GEMM kernels' tilings
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kernels.benchmarks.constants import set_constants  # noqa: E402
from kernels.kda import chunk_triton as ct  # noqa: E402

SHAPE = dict(HV=32, K=128, V=128, BK=128, C=64)


def _launch() -> tuple[dict, dict, dict]:
    """``(warps, stages, maxnreg)`` per forward kernel, as ``chunk_triton._fwd`` launches them now."""
    warps = dict(prep=ct.PREP_LAUNCH[0], scores2=ct.SCORES2_LAUNCH[0], state=ct.STATE_LAUNCH[0], output=ct.OUT_WARPS)
    s2 = ct.SCORES2_NORMS_STAGES if ct.SCORES2_NORMS else ct.SCORES2_LAUNCH[1]
    stages = dict(prep=ct.PREP_LAUNCH[1], scores2=s2, state=ct.STATE_LAUNCH[1], output=3)
    return warps, stages, {"scores2": ct.SCORES2_MAXNREG}


KERNELS = ("prep", "scores2", "state", "output")


def _signature(name: str) -> tuple:
    """Argument types for a bf16 run at K = V = 128 with in-kernel L2 norm and softplus gate (pointers to bf16
    inputs and scratch, fp32 G / T / norms / gates / states, int32 tables); the launch's tile constants."""
    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    tab = [("cbos", i32), ("clen", i32)]
    if name == "prep":
        args = [("q", bf), ("k", bf), ("g", bf), ("alog", f32), ("dtb", f32), ("lb", "fp32")] + tab
        args += [("G", f32), ("gl", f32), ("rq", f32), ("rk", f32), ("E", bf)]
        fn = ct._prep_kernel
        extra = dict(QS=32 * 128, H=32, BKP=ct.PREP_BK, GATE=True, LOWER=False, HAS_DTB=True,
                     L2=not ct.SCORES2_NORMS, SUFFIX=False, HEADS_FIRST=ct.PREP_HEADS_FIRST)
    elif name == "scores2":  # scores, solve and W / U in one program
        args = [("q", bf), ("k", bf), ("beta", bf), ("G", f32), ("rq", f32), ("rk", f32)] + tab + [("cidx", i32)]
        args += [("Aqk", bf), ("Akk", f32), ("T", f32), ("v", bf), ("W", bf), ("U", bf), ("qg", bf), ("kg", bf)]
        args += [("scale", "fp32"), ("span_max", "fp32"), ("VS", "i32")]
        fn = ct._scores2_kernel
        extra = dict(QS=32 * 128, H=32, S=ct.SUB, BKS=ct.SCORES2_BK, BKW=ct.WU_B, BVW=ct.WU_B, L2=True, PREC="tf32",
                     DPREC=ct.INTRA_DIAG_PREC16, SUFFIX=False, HEADS_FIRST=ct.SCORES2_HEADS_FIRST,
                     DINV=ct.SCORES2_DIAG_INV, NORMS=ct.SCORES2_NORMS, HAS_CIDX=True)
    elif name == "state":
        args = [(n, bf) for n in "W U kg".split()] + [("gl", f32), ("h0", f32), ("h", bf), ("vn", bf)]
        args += [("ht", f32), ("sc0", i32), ("snc", i32)]
        fn, extra = ct._state_kernel, dict(BV=ct.STATE_BV or 16, HAS_H0=True, FP32=False)  # None: 16 here
    else:
        args = [(n, bf) for n in "qg h Aqk vn o".split()] + tab + [("cidx", i32)]
        fn, extra = ct._output_kernel, dict(BV=ct.OUT_BV, FP32=False, HEADS_FIRST=ct.OUT_HEADS_FIRST,
                                                   HAS_CIDX=True)
    consts = {k: v for k, v in SHAPE.items() if k in fn.arg_names} | extra
    sig = dict(zip(fn.arg_names, [t for _, t in args] + ["constexpr"] * len(consts)))
    return fn, sig, consts


def ptxas_report(name: str, num_warps: int, num_stages: int = 2, maxnreg: int | None = None) -> str:
    fn, sig, consts = _signature(name)
    opts = {"num_warps": num_warps, "num_stages": num_stages} | ({"maxnreg": maxnreg} if maxnreg else {})
    return compile_report(fn, sig, consts, opts)


_PTX_ISA_12 = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 5, 8: 7, 9: 8}  # CUDA 12.minor -> the newest PTX ISA 8.x it reads


def compile_report(fn, sig: dict, consts: dict, opts: dict, attrs: dict | None = None, shared: bool = False) -> str:
    """Compile ``fn`` for sm_90a with Triton (no GPU needed) and return ptxas's register / spill lines. ``attrs``:
    Triton's argument specialisations (e.g. ``{(i,): [["tt.divisibility", 16]]}``); None: every pointer argument
    16-byte aligned, as a launch with aligned tensors gets (without it loads compile unvectorised: the KDA prep
    kernel loaded one 16-bit element at a time here and took 88 registers against 72 on the GPU, session 24)."""
    if attrs is None:
        attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    ver = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", ver)
    ptx = k.asm["ptx"]
    cur = re.search(r"^\.version (\d+)\.(\d+)", ptx, flags=re.M)
    if m and cur:  # PTX newer than this ptxas reads is declared at its newest ISA (CUDA 12.x: 8.x, 13.x: 9.x)
        major, minor = int(m.group(1)), int(m.group(2))
        top = (8, _PTX_ISA_12.get(minor, 8)) if major == 12 else (major - 4, minor)
        if (int(cur.group(1)), int(cur.group(2))) > top:
            ptx = re.sub(r"^\.version \d+\.\d+", f".version {top[0]}.{top[1]}", ptx, count=1, flags=re.M)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.ptx")
        open(p, "w").write(ptx)
        r = subprocess.run(
            [ptxas, "-v", "--gpu-name=sm_90a", p, "-o", os.path.join(d, "k.o")], capture_output=True, text=True
        )
    lines = [line.strip() for line in (r.stderr + r.stdout).splitlines() if re.search("regist|spill|rror", line)]
    if shared:  # Triton's shared memory (software-pipelined loads stage through it) and its cp.async count
        lines.append(f"shared memory {k.metadata.shared} bytes, {ptx.count('cp.async.c')} cp.async copies, "
                     f"{ptx.count('wgmma.mma_async')} wgmma")
    return "\n".join(lines)


def conv_bwd_stream_ptxas_report(w: int = 4, bd: int = 128, warps: int = 1, rows: int = 256, stages: int = 3,
                                 varlen: bool = True, state: bool = False, bias: bool = False,
                                 dfs: bool = False) -> str:
    """``kernels.short_conv``'s streaming one-kernel backward (``_conv_bwd_stream_kernel``) for bf16 x."""
    from kernels.short_conv import conv_triton

    fn = conv_triton._conv_bwd_stream_kernel
    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    args = [bf, bf, bf, bf, bf, bf, bf, f32, f32, i32, i32, "i32", "i32", "i32"]
    consts = dict(W=w, BW=max(2, triton.next_power_of_2(w)), ROWS=rows, BD=bd, ACT=True, HAS_BIAS=bias,
                  HAS_STATE=state, HAS_DFS=dfs, VARLEN=varlen, ACC=triton.language.float32)
    sig = dict(zip(fn.arg_names, args + ["constexpr"] * len(consts)))
    return compile_report(fn, sig, consts, {"num_warps": warps, "num_stages": stages})


def ce_ptxas_report(kernel: str, V: int = 32768) -> str:
    """``kernels.cross_entropy``'s loss + gradient kernels (``row``: whole rows of V bf16 logits at
    ``FWD_GRAD_ROW_WARPS``; ``chunks`` / ``persistent``: the two-pass form) or ``scale_rows`` (D = 768), as
    ``ce_forward_grad_`` / ``scale_rows`` launch them."""
    from kernels.cross_entropy import ce_triton as ce

    bf, i32 = "*bf16", "i32"
    if kernel == "row":
        fn, block = ce._ce_fwd_grad_row_kernel, triton.next_power_of_2(V)
        args, consts, warps = [bf, "*i64", "*fp32", i32, i32, i32], dict(BLOCK_V=block), max(1, min(
            ce.FWD_GRAD_ROW_WARPS, block // 256))
    elif kernel in ("chunks", "persistent"):
        fn, (block, warps) = ce._ce_fwd_grad_kernel, ce._config(V)
        args, consts = [bf, "*i64", "*fp32", i32, i32, i32, i32], dict(BLOCK_V=block, PERSISTENT=kernel == "persistent")
    else:
        fn, args, consts, warps = ce._scale_rows_kernel, [bf, "*fp32", bf, i32, i32], dict(BR=4, BD=1024), 4
    sig = dict(zip(fn.arg_names, args + ["constexpr"] * len(consts)))
    return compile_report(fn, sig, consts, {"num_warps": warps, "num_stages": 1})


def mla_expand_ptxas_report(kernel: str) -> str:
    """``kernels.mla_expand``'s ``fwd`` or ``bwd`` kernel for bf16 at the small flavor's head dims (128 / 64 / 128)."""
    from kernels import mla_expand as me

    bf, i32 = "*bf16", "i32"
    if kernel == "fwd":
        fn, ptrs, ints = me._expand_fwd_kernel, 3, 10
        consts = dict(DN=128, DR=64, BLOCK_S=me.BLOCK_S, BN=128, BR=64)
    else:
        fn, ptrs, ints = me._expand_bwd_kernel, 4, 13
        consts = dict(DN=128, DV=128, DR=64, BLOCK_S=me.BLOCK_S, BN=128, BV=128, BR=64)
    sig = dict(zip(fn.arg_names, [bf] * ptrs + [i32] * ints + ["constexpr"] * len(consts)))
    return compile_report(fn, sig, consts, {"num_warps": me.NUM_WARPS, "num_stages": 2})


def swiglu_ptxas_report(kind: str, cfg=None) -> str:
    """``kernels.swiglu``'s ``fwd`` (gate/up GEMM + ``silu_mul``) or ``bwd`` (``dh`` GEMM + its backward) kernel for
    bf16 at a GEMM width of 768 (the small flavor's ``K`` / ``D``), under ``cfg`` (a ``GemmConfig``; default: the
    module's ``GPU_CONFIG``), with its shared memory and ``wgmma`` count (Hopper's asynchronous MMA)."""
    from kernels.swiglu import swiglu_triton as st

    cfg = cfg or st.GPU_CONFIG[kind]
    fn = st._gate_up_silu_kernel if kind == "fwd" else st._down_silu_bwd_kernel
    consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                  EVEN_K=768 % cfg.block_k == 0, PRECISION="tf32", UPCAST=False)
    sig = dict(zip(fn.arg_names, ["*bf16"] * 4 + ["i32"] * 3 + ["constexpr"] * len(consts)))
    # pointers and sizes divisible by 16, as a launch at the model's sizes specialises them: without the sizes'
    # divisibility a row's alignment is unknown, loads stay 2-byte and nothing is software-pipelined
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(7)}
    return compile_report(fn, sig, consts, {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}, attrs,
                          shared=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", choices=("all",) + KERNELS, default="all")
    ap.add_argument("--num-warps", type=int, default=None, help="default: the launch's")
    ap.add_argument("--maxnreg", type=int, default=None, help="default: the launch's (None: ptxas chooses)")
    ap.add_argument("--attnres", action="store_true", help="the AttnRes mix kernels at N = 1..7 instead")
    ap.add_argument("--swiglu", action="store_true",
                    help="the SwiGLU GEMM kernels under bench_swiglu's FWD_SWEEP / BWD_SWEEP tilings instead")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a module constant of chunk_triton (or, with --attnres, mix_triton) for this compile, e.g. "
                         "--set PREP_BK=16 --set 'INTRA_DIAG_PREC16=\"ieee\"'")
    args = ap.parse_args()
    _set_constants(args.set, args.attnres)
    if args.swiglu:
        from kernels.benchmarks.bench_swiglu import BWD_SWEEP, FWD_SWEEP
        from kernels.swiglu.swiglu_triton import GemmConfig

        for kind, table in (("fwd", FWD_SWEEP), ("bwd", BWD_SWEEP)):
            for spec in table:
                print(kind, spec, " | ".join(swiglu_ptxas_report(kind, GemmConfig(*spec)).splitlines()), flush=True)
        return
    if args.attnres:
        for kernel in ("fwd", "bwd", "flush"):
            for n in range(1, 8):
                print(f"{kernel} N={n}", " | ".join(attnres_ptxas_report(kernel, n).splitlines()), flush=True)
        for n in range(2, 8):  # the deferring backward: every source but the block's partial sum
            print(f"bwd N={n} defer", " | ".join(attnres_ptxas_report("bwd", n, defer=(1 << (n - 1)) - 1).splitlines()),
                  flush=True)
        return
    warps, stages, maxnreg = _launch()
    for name in KERNELS if args.kernel == "all" else (args.kernel,):
        nw = args.num_warps or warps[name]
        mr = args.maxnreg or maxnreg.get(name)
        report = ptxas_report(name, nw, stages[name], maxnreg=mr)
        print(f"{name} num_warps={nw} num_stages={stages[name]} maxnreg={mr}\n{report}", flush=True)


def _set_constants(pairs: list[str], attnres: bool) -> None:
    """Apply ``NAME=VALUE`` pairs (VALUE a Python literal) to the kernels' module, refusing unknown names."""
    from kernels.attn_res import mix_triton as mt

    set_constants(mt if attnres else ct, pairs, "ptxas_regs.py")



def bwd_ptxas_report(name: str, num_warps: int | None = None, num_stages: int | None = None, fused: bool = True,
                     **tiles) -> str:
    """Registers and spills of a backward kernel of ``chunk_triton_bwd`` (``state``, ``dy``, ``pair`` or ``inter``)
    for a bf16 run at K = V = 128 (g fp32 from the PyTorch gate; dH and dVnew / dY bf16 with ``BWD_DH_16BIT`` and
    ``BWD_DVN_16BIT``, else fp32; fp32 dA and gradients); warps, stages and ``tiles`` (BV, BK) default to the
    launch's (``chunk_triton_bwd.BWD_LAUNCH`` and tile constants). ``fused``: the training path's dY, pair and inter
    kernels with ``chunk_triton.BWD_FUSED_L2`` and ``BWD_FUSED_GATE`` (raw q, k rows of the q|k|v tensor with the
    forward's inverse norms; the inter kernel with the softplus gate's backward and dt_bias, writing a bf16 d g_raw);
    else normalised q, k.

        .venv/bin/python -c "from kernels.benchmarks.ptxas_regs import bwd_ptxas_report as r; print(r('inter'))"
    """
    from kernels.kda import chunk_triton_bwd as cb
    from kernels.kda.pair_triton_bwd import _bwd_intra_pair_kernel

    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    tab = [i32, i32]
    dh, dvn = (bf if on else f32 for on in (cb.BWD_DH_16BIT, cb.BWD_DVN_16BIT))
    if name == "state":
        args = [bf, bf, bf, bf, f32, bf, f32, dh, dvn, f32] + tab + tab
        fn, consts = cb._bwd_state_kernel, dict(HV=32, K=128, V=128, BK=128, BV=cb.BWD_STATE_BV or 32, C=64)
        consts |= dict(HAS_DHT=True, FP32=False)
    elif name == "dy":
        args = [f32, bf, bf, bf, bf, dvn, f32, f32, f32, f32] + tab + [f32, f32, "i32", "i32"]
        fn, consts = cb._bwd_dy_kernel, dict(HV=32, V=128, BV=cb.BWD_DY_BV, C=64, FP32=False, PREC="tf32", L2=fused)
    elif name == "pair":
        args = [bf, bf, f32, f32, bf, f32, f32, f32] + tab + [f32] * 4 + ["fp32", "i32", "fp32"]
        fn, consts = _bwd_intra_pair_kernel, dict(H=32, HV=32, K=128, BK=cb.BWD_PAIR_BK, C=64, S=16, PREC="tf32")
        consts |= dict(DPREC=cb.BWD_DIAG_PREC16, QS=(3 if fused else 1) * 32 * 128, UNROLL=cb.BWD_PAIR_UNROLL[0],
                       L2=fused)
    else:
        # dq, dk, dg fp32 partial sums in; dq, dk out in bf16, dg out in fp32 (the gate's dtype; fused: d g_raw in
        # bf16); dbeta fp32; the gate's g_raw, A_log, dt_bias, partial sums, lower bound
        args = [bf, bf, f32, f32, f32, bf, f32, f32, bf, bf, dvn, bf, dh] + tab + [f32] * 3
        args += [bf, bf, bf if fused else f32, f32, bf, f32, f32, f32, f32, "fp32", "fp32", "i32"]
        fn, consts = cb._bwd_inter_kernel, dict(H=32, HV=32, K=128, V=128, BK=cb.BWD_INTER_BK, BV=cb.BWD_INTER_BV)
        consts |= dict(C=64, FP32=False, PREC="tf32", QS=(3 if fused else 1) * 32 * 128,
                       EE_DIFF=cb.BWD_EE_FROM_G != "never", L2=fused, GATE=fused, LOWER=False, HAS_DTB=fused)
    consts |= tiles
    sig = dict(zip(fn.arg_names, args + ["constexpr"] * len(consts)))
    nw, ns = cb.BWD_LAUNCH[name]
    return compile_report(fn, sig, consts, {"num_warps": num_warps or nw, "num_stages": num_stages or ns})


def attnres_ptxas_report(kernel: str, n: int, d: int = 768, defer: int = 0, mixes: int = 6,
                         stages: int | None = None) -> str:
    """Registers and spills of an AttnRes mix kernel (``kernels/attn_res/mix_triton.py``) for bf16 sources of width
    ``d`` over ``n`` sources, with the launch's own tile constants: ``kernel`` is ``fwd`` (the pointer-argument
    forward), ``bwd`` (the pointer-argument backward; ``defer``: its mask of deferred sources) or ``flush`` (the
    deferred gradients of ``n`` sources from ``mixes`` mixes), or ``mix_norm_fwd`` / ``mix_norm_bwd`` (the mix with its
    sublayer's RMSNorm, ``mix_norm_triton.py``; the backward stores ``dh`` when it defers). ``stages``: the backward
    loop's software-pipelining stages (None: ``BWD_STAGES``; for ``mix_norm_bwd`` by ``N`` and deferral).

        .venv/bin/python -c "from kernels.benchmarks.ptxas_regs import attnres_ptxas_report as r; print(r('bwd', 5))"
    """
    from kernels.attn_res import mix_norm_triton as mn
    from kernels.attn_res import mix_triton as mt

    bf, f32 = "*bf16", "*fp32"
    srcs = [bf] * mt.MAX_ARGS
    if kernel == "fwd":
        fn = mt._attn_res_fwd_rows_kernel
        block_t, chunk, ch = mt._row_blocks(d, 2, mt.FWD_NUM_WARPS, mt.FWD_MAX_CHUNKS, mt.FWD_THREAD_ELEMS)
        args = srcs + [f32, bf, f32, f32, "i32", "i32", "fp32"]
        consts, warps = dict(N=n, BLOCK_T=block_t, CHUNK=chunk, CH=ch, PRE=mt.FWD_PREFETCH), mt.FWD_NUM_WARPS
    elif kernel == "bwd":
        fn = mt._attn_res_bwd_args_kernel
        block_t, chunk, ch = mt._row_blocks(d, 2, mt.BWD_NUM_WARPS, mt.BWD_MAX_CHUNKS, mt.BWD_THREAD_ELEMS)
        args = srcs + srcs + [f32, bf, f32, f32, f32, "i32", "i32", "i32", "i32", f32]
        consts = dict(N=n, BLOCK_T=block_t, CHUNK=chunk, CH=ch, DEFER=defer, PRE=mt.BWD_PREFETCH,
                      STAGES=stages or mt.BWD_STAGES)
        warps = mt.BWD_NUM_WARPS
    elif kernel == "flush":
        fn = mt._attn_res_flush_kernel
        block_t, chunk, ch = mt._row_blocks(d, 2, mt.FLUSH_NUM_WARPS, mt.FLUSH_MAX_CHUNKS, mt.FLUSH_THREAD_ELEMS)
        args = srcs * 3 + [f32] * (2 * mt.MAX_ARGS) + ["i32", "i32", "i32"]
        consts = dict(C=n, S=mixes, BLOCK_T=block_t, CHUNK=chunk, CH=ch, GROUP=mt.FLUSH_GROUP)
        warps = mt.FLUSH_NUM_WARPS
    elif kernel == "mix_norm_fwd":
        fn = mn._mix_norm_fwd_kernel
        block_t, chunk, ch = mt._row_blocks(d, 2, mt.FWD_NUM_WARPS, mt.FWD_MAX_CHUNKS, mt.FWD_THREAD_ELEMS)
        args = srcs + [f32, bf, bf, f32, f32, f32, "i32", "i32", "fp32", "fp32"]
        consts, warps = dict(N=n, BLOCK_T=block_t, CHUNK=chunk, CH=ch, PRE=mt.FWD_PREFETCH), mt.FWD_NUM_WARPS
    elif kernel == "mix_norm_bwd":
        fn = mn._mix_norm_bwd_kernel
        block_t, chunk, ch = mt._row_blocks(d, 2, mt.BWD_NUM_WARPS, mt.BWD_MAX_CHUNKS, mt.BWD_THREAD_ELEMS)
        args = srcs + srcs + [f32, bf, bf, f32, bf, f32, f32, f32, "i32", "i32", "i32", "i32", f32]
        consts = dict(N=n, BLOCK_T=block_t, CHUNK=chunk, CH=ch, DEFER=defer,
                      STAGES=stages or mn.BWD_STAGES.get((n, defer != 0), 1), STORE_DH=defer != 0)
        warps = mt.BWD_NUM_WARPS
    else:
        raise ValueError(f"attnres_ptxas_report: kernel must be fwd, bwd, flush, mix_norm_fwd or mix_norm_bwd, got "
                         f"{kernel!r}")
    it = iter(args)
    sig = {a: "constexpr" if a in consts else next(it) for a in fn.arg_names}
    # as a launch specialises them: 16-byte aligned pointers, M and D multiples of 16
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
               if sig[a].startswith("*") or a in ("M", "D")}
    return compile_report(fn, sig, consts, {"num_warps": warps, "num_stages": 2}, aligned, shared=True)


def two_phase_ptxas_report(kernel: str, d: int = 768, slots: int = 6, queries: int = 6, norm: bool = True,
                           qpar: bool = True) -> str:
    """Registers and spills of a two-phase AttnRes kernel (``kernels/attn_res/two_phase_triton.py``) for bf16 block
    states of width ``d``, with the launcher's own constants: ``kernel`` is ``rows`` (decode phase 1; ``qpar``: one
    program per token and query), ``tiled`` (phase 1 over token tiles) or ``phase2``; ``norm``: the input RMSNorm
    applied in the kernel; a pending output absorbed; phase 2 at the decode launch's rows per program.

        .venv/bin/python -c "from kernels.benchmarks.ptxas_regs import two_phase_ptxas_report as r; print(r('rows'))"
    """
    from kernels.attn_res import mix_triton as mt
    from kernels.attn_res import two_phase_triton as tp

    block_t, block_d = mt._blocks(d)
    flags = dict(D=d, PEND=True, PEND_FIRST=False, NORM=norm)
    if kernel == "rows":
        fn, warps = tp._phase1_rows_kernel, tp.ROWS_NUM_WARPS
        consts = flags | dict(U_ALIGNED=True, KP=triton.next_power_of_2(slots), BLOCK_D=block_d, QMAX=queries,
                              QPAR=qpar)
    elif kernel == "tiled":
        fn, warps = tp._phase1_kernel, mt.NUM_WARPS
        consts = flags | dict(U_ALIGNED=True, BLOCK_T=block_t, BLOCK_D=block_d)
    elif kernel == "phase2":
        fn, warps = tp._phase2_kernel, tp.PHASE2_NUM_WARPS
        consts = flags | dict(BLOCK_T=tp.PHASE2_DECODE_ROWS or block_t, BLOCK_D=block_d)
    else:
        raise ValueError(f"two_phase_ptxas_report: kernel must be rows, tiled or phase2, got {kernel!r}")

    def arg_type(a: str) -> str:
        if a in consts:
            return "constexpr"
        if a == "qtab":
            return "*i64"
        if a.endswith("_ptr"):
            return "*fp32" if a in ("o_ptr", "m_ptr", "l_ptr") else "*bf16"
        return "fp32" if a in ("eps", "norm_eps") else "i32"

    sig = {a: arg_type(a) for a in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if sig[a].startswith("*")}
    return compile_report(fn, sig, consts, {"num_warps": warps, "num_stages": 2}, aligned)


def norm_bwd_ptxas_report(d: int = 768, gated: bool = False, stream: bool = False, rows: bool = True) -> str:
    """Registers and spills of the RMSNorm backward (``kernels/norm/norm_triton.py``) for bf16 rows of width ``d``
    with the launch's own constants: the row layout (``rows``) or the tile kernel.

        .venv/bin/python -c "from kernels.benchmarks.ptxas_regs import norm_bwd_ptxas_report as r; print(r(768))"
    """
    from kernels.norm import norm_triton as nt

    bf, f32 = "*bf16", "*fp32"
    ptrs = [bf, bf, bf if not gated else f32, f32, bf, bf, bf, f32, bf]
    if rows:
        layout = nt._row_layout(1 << 15, d, 2, torch.device("cpu"))
        if layout is None:
            raise ValueError(f"norm_bwd_ptxas_report: rows of {d} bf16 take the tile kernel (NORM_ROWS_MAX_CHUNKS)")
        block_t, chunk, ch, _ = layout
        fn, consts = nt._norm_bwd_rows_kernel, dict(BLOCK_T=block_t, CHUNK=chunk, CH=ch, GATED=gated, STREAM=stream)
        args = ptrs + ["i32", "i32", "i32"]
    else:
        block_m, block_d, tiles, _ = nt._bwd_grid(1 << 15, d)
        fn = nt._norm_bwd_kernel
        consts = dict(BLOCK_M=block_m, BLOCK_D=block_d, TILES=tiles, GATED=gated, STREAM=stream)
        args = ptrs + ["i32", "i32"]
    it = iter(args)
    sig = {a: "constexpr" if a in consts else next(it) for a in fn.arg_names}
    return compile_report(fn, sig, consts, {"num_warps": nt.NORM_WARPS if rows else nt.NORM_BWD_WARPS,
                                            "num_stages": 2})


if __name__ == "__main__":
    main()
