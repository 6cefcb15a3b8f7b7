#!/usr/bin/env bash
# Nsight Compute on the KDA kernels of one bf16 training step at (1, 8192, 32), K = V = 128 (GPU machine):
#   bash kernels/benchmarks/ncu_kda.sh [KERNEL_REGEX]   -> $OUT/ncu_kda.txt
# Two warm-up steps (compiles, fla's autotuning) run outside the profiled range (--profile-from-start off), then one
# profiled step per implementation. NCU_SKIP / NCU_COUNT (default 0 / 20): matching launches of the profiled range
# skipped, then profiled (a step launches each forward kernel once and each backward kernel once); NCU_EXTRA: more
# ncu flags (e.g. "--section SourceCounters": where in the kernel the warps stall, by source line); NCU_IMPLS: which implementations run their steps (default
# "ours"; "ours fla" also runs fla-core's, so that a regex can take its kernels too).
# Sections: speed of light, occupancy, launch statistics, warp states (why warps stall), memory workload.
set -u
OUT=${OUT:-/tmp/out}
REGEX=${1:-_bwd_intra_pair|_bwd_inter|_scores2|_bwd_state|_bwd_dy}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ -z "$NCU" ]; then echo "ncu not found"; exit 0; fi
mkdir -p "$OUT"
"$NCU" --profile-from-start off --kernel-name "regex:$REGEX" --launch-skip "${NCU_SKIP:-0}" \
  --launch-count "${NCU_COUNT:-20}" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis ${NCU_EXTRA:-} \
  python3 - <<'PY' > "$OUT/ncu_kda.txt" 2>&1
import os
import torch
from kernels.benchmarks.bench_kda import V, call, make
xs = make(1, 8192, 32, grad=True)
do = torch.randn(1, 8192, 32, V, dtype=torch.bfloat16, device="cuda")
impls = os.environ.get("NCU_IMPLS", "ours").split()
for impl in impls:
    for _ in range(2):
        torch.autograd.backward(call(impl, xs)[0], do)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for impl in impls:
    torch.autograd.backward(call(impl, xs)[0], do)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
PY
grep -E "^  [A-Za-z_][A-Za-z0-9_]* \(|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Memory Throughput|Compute \(SM\)|Block Limit|Stall|Warp Cycles Per Issued|Waves Per SM|Dynamic Shared|Static Shared" "$OUT/ncu_kda.txt" | head -n 120
