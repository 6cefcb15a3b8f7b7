#!/usr/bin/env bash
# One GPU call for the KDA operator (issue 4), run from the repo root on the GPU machine:
#   bash scripts/gpu_kda_check.sh [BENCH_LIMIT_S]   (env KVL_BENCH_ARGS: bench_kda.py flags, default --profile)
# 1. the GPU kernel tests (`pytest -m gpu tests/kernels`, summary line kept; skipped with KVL_SKIP_TESTS=1);
# 2. ours vs fla-core in the same run at the issue's five shapes (`bench_kda.py`, per-kernel profiles).
# KVL_PICK_FWD="setting,...": before the benchmark, `sweep_kda_fwd.py --only` those settings and benchmark ours with
# the fastest one whose output error is within 2% of the lowest (`--best-out` / `--set-file`).
# KVL_TESTS: the test path (default tests/kernels).
# fla tunes its kernels on first use (minutes per head count). If `.fla_tcache/tcache` holds the `*.autotune.json`
# files of an earlier run (same GPU kind, Triton and fla versions), it becomes TRITON_CACHE_DIR and fla only
# compiles; the new tuning files come back in $OUT/fla_autotune.tar.gz either way.
set -u
source scripts/gpu_parts.sh
LIMIT=${1:-420}
gpu_header
install_fla
use_fla_tuning_cache
[ "${KVL_SKIP_TESTS:-0}" = 1 ] || part gpu_tests "${KVL_TESTS_LIMIT:-200}" python3 -m pytest -q -m gpu -n 14 \
  -p no:cacheprovider -p no:warnings "${KVL_TESTS:-tests/kernels}"
SET=()
if [ -n "${KVL_PICK_FWD:-}" ]; then
  PART_TAIL=20 part pick_fwd "${KVL_PICK_LIMIT:-120}" python3 kernels/benchmarks/sweep_kda_fwd.py --only "$KVL_PICK_FWD" \
    --best-out /tmp/kda_best.txt --out "$OUT/sweep_kda_fwd.json"
  [ -f /tmp/kda_best.txt ] && SET=(--set-file /tmp/kda_best.txt) && { echo "ours with:"; cat /tmp/kda_best.txt; } | tee -a "$LOG"
fi
PART_TAIL=60 part bench "$LIMIT" python3 kernels/benchmarks/bench_kda.py ${KVL_BENCH_ARGS:---profile} --deadline $((LIMIT - 60)) \
  --shapes 1x8192x32,4x4096x32,1x32768x16,8x2048x16,2x16384x16 "${SET[@]}" --out "$OUT/bench_kda.json"
(cd "$(dirname "$TRITON_CACHE_DIR")" && find "$(basename "$TRITON_CACHE_DIR")" -name "*.autotune.json" \
  | tar czf "$OUT/fla_autotune.tar.gz" -T -)
ls -la "$OUT"
