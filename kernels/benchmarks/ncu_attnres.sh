#!/usr/bin/env bash
# Nsight Compute on the AttnRes mix kernels at the small flavor's step size (M = 8 x 4096, D = 768, bf16; GPU machine):
#   bash kernels/benchmarks/ncu_attnres.sh [N]   -> $OUT/ncu_attnres.txt
# One warm-up call of each (compiles), then one profiled call each: the fused mix + norm forward and deferring backward
# (kernels/attn_res/mix_norm_triton.py), the mix's own forward and deferring backward (mix_triton.py) and the norm's
# forward and backward (kernels/norm), all over N sources (default 3). Sections: speed of light, occupancy, warp states
# (why warps stall), memory workload; NCU_EXTRA: more ncu flags.
set -u
OUT=${OUT:-/tmp/out}
N=${1:-3}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ -z "$NCU" ]; then echo "ncu not found"; exit 0; fi
mkdir -p "$OUT"
N=$N "$NCU" --profile-from-start off --kernel-name "regex:_mix_norm|_attn_res|_norm_" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis ${NCU_EXTRA:-} \
  python3 - <<'PY' > "$OUT/ncu_attnres.txt" 2>&1
import os
import torch
from kernels.attn_res.mix_norm_triton import mix_norm_bwd_triton, mix_norm_fwd_triton
from kernels.attn_res.mix_triton import mix_bwd_triton, mix_fwd_triton
from kernels.benchmarks.bench_mix_norm import inputs
from kernels.norm import norm_triton as nt

n = int(os.environ["N"])
a = inputs(n, torch.bfloat16)
src, u, nw, dy = a["src"], a["u"], a["nw"], a["dy"]
defer = (1 << (n - 1)) - 1


def calls():
    yf, hrf, rstdf, alphaf = mix_norm_fwd_triton(src, u, 1e-6, nw, 1e-6)
    mix_norm_bwd_triton(src, u, nw, dy, hrf, rstdf, alphaf, None, defer, store_dh=True)
    h, rstd, alpha = mix_fwd_triton(src, u, 1e-6)
    y, hr = nt.norm_fwd(h, None, nw, 1e-6)
    dh = nt.norm_bwd(h, None, nw, hr, dy)[0]
    mix_bwd_triton(src, u, dh, rstd, alpha, None, defer)


calls()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
calls()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
PY
grep -E "^  [A-Za-z_][A-Za-z0-9_]* \(|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Memory Throughput|Compute \(SM\)|Block Limit|Stall|Warp Cycles Per Issued|Waves Per SM|L1/TEX Hit|L2 Hit|Local" "$OUT/ncu_attnres.txt" | head -n 150
