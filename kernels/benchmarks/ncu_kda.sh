#!/usr/bin/env bash
# Nsight Compute on the KDA kernels of one bf16 training step at (1, 8192, 32), K = V = 128 (GPU machine):
#   bash kernels/benchmarks/ncu_kda.sh [KERNEL_REGEX]   -> $OUT/ncu_kda.txt
# NCU_SKIP / NCU_COUNT (default 5 / 5): matching launches skipped, then profiled (three steps run; a step launches
# each forward kernel once and each backward kernel once); NCU_EXTRA: more ncu flags (e.g. "--section SourceCounters":
# where in the kernel the warps stall, by source line).
# Sections: speed of light, occupancy, launch statistics, warp states (why warps stall), memory workload.
set -u
OUT=${OUT:-/tmp/out}
REGEX=${1:-_bwd_intra_pair|_bwd_inter|_scores2|_bwd_state|_bwd_dy}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ -z "$NCU" ]; then echo "ncu not found"; exit 0; fi
mkdir -p "$OUT"
"$NCU" --kernel-name "regex:$REGEX" --launch-skip "${NCU_SKIP:-5}" --launch-count "${NCU_COUNT:-5}" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis ${NCU_EXTRA:-} \
  python3 - <<'PY' > "$OUT/ncu_kda.txt" 2>&1
import torch
from kernels.benchmarks.bench_kda import V, call, make
xs = make(1, 8192, 32, grad=True)
do = torch.randn(1, 8192, 32, V, dtype=torch.bfloat16, device="cuda")
for _ in range(3):
    torch.autograd.backward(call("ours", xs)[0], do)
torch.cuda.synchronize()
PY
grep -E "^  _|Duration|Achieved Occupancy|Theoretical Occupancy|Registers Per|Memory Throughput|Compute \(SM\)|Block Limit|Stall|Warp Cycles Per Issued|Waves Per SM|Dynamic Shared|Static Shared" "$OUT/ncu_kda.txt" | head -n 120
