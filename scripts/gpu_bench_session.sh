#!/usr/bin/env bash
# Every single-GPU benchmark of the suite in one call of about 9 minutes (run from the repo root on an H100):
#   bash scripts/gpu_bench_session.sh
# In order of importance, each part under its own time limit (a part cut by its limit leaves what it wrote):
#  1. KDA: ours at the five issue shapes (per-kernel profile), then ours vs fla-core (same process) at 1x8192x32
#     with our two backward variants timed beside (fla autotunes once per head count: 1-2.5 min);
#  2. the GPU-marked kernel tests (KDA, its prep, short conv, AttnRes), compilation spread over the CPU cores;
#  3. MuonClip step vs torch.optim.Muon; 4. AttnRes mix and step overhead; 5. short conv;
#  6. the small backbone: hybrid vs all-MLA training at 4K/32K, decode at 128K.
# JSON per part in $OUT, one combined log $OUT/all.log. fla-core comes from the carried wheel in .whl/.
set -u
source "$(dirname "$0")/gpu_parts.sh"
install_fla
gpu_header
part "KDA ours, five shapes" 150 python3 kernels/benchmarks/bench_kda.py --impls ours --profile \
  --deadline 120 --out "$OUT/bench_kda_ours.json"
part "KDA ours vs fla, 1x8192x32" 200 python3 kernels/benchmarks/bench_kda.py --impls ours,fla \
  --shapes 1x8192x32 --no-prelude --deadline 190 --out "$OUT/bench_kda_vs_fla.json"
part "GPU kernel tests" 100 python3 -m pytest -q -m gpu -n 14 -p no:cacheprovider tests/kernels
part "MuonClip" 50 python3 -m kimi_vl.benchmarks.bench_muon
part "AttnRes" 70 python3 -m kimi_vl.benchmarks.bench_attnres --budget-s 45
part "short conv" 30 python3 kernels/benchmarks/bench_short_conv.py
part "backbone" 110 python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 32768 --decode-contexts 131072 \
  --iters 2 --decode-steps 16 --variants hybrid full_attn --peak-tflops 709
ls -la "$OUT"
