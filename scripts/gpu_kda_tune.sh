#!/usr/bin/env bash
# One GPU call to check and tune the KDA kernels (issue 4), run from the repo root on the GPU machine:
#   bash scripts/gpu_kda_tune.sh [SWEEP_FWD_LIMIT_S] [SWEEP_BWD_LIMIT_S] [FWD_ONLY] [BWD_ONLY]
# 1. the GPU kernel tests (`pytest -m gpu tests/kernels`, summary line kept; skipped with KVL_SKIP_TESTS=1);
# 2. `sweep_kda_fwd.py` (forward launch settings; fla's forward in the same run) at 1x8192x32;
# 3. `sweep_kda_bwd.py` (backward launch settings) at 1x8192x32.
# FWD_ONLY / BWD_ONLY: comma-separated setting names to restrict the sweeps ("" = all).
# fla's tuning results are reused from `.fla_tcache/tcache` as in gpu_kda_check.sh.
set -u
source scripts/gpu_parts.sh
FWD_LIMIT=${1:-200}
BWD_LIMIT=${2:-150}
gpu_header
install_fla
use_fla_tuning_cache
[ "${KVL_SKIP_TESTS:-0}" = 1 ] || part gpu_tests 200 python3 -m pytest -q -m gpu -n 14 -p no:cacheprovider -p no:warnings tests/kernels
PART_TAIL=30 part sweep_fwd "$FWD_LIMIT" python3 kernels/benchmarks/sweep_kda_fwd.py --only "${3:-}" \
  --out "$OUT/sweep_kda_fwd.json"
PART_TAIL=30 part sweep_bwd "$BWD_LIMIT" python3 kernels/benchmarks/sweep_kda_bwd.py --only "${4:-}" \
  --out "$OUT/sweep_kda_bwd.json"
ls -la "$OUT"
