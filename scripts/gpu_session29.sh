#!/usr/bin/env bash
# Session 29's GPU calls (results: docs/results/gpu-<date>-s29/):
#   bash scripts/gpu_session29.sh attnres   call1: block AttnRes's running sums added inside the mix kernels
#       (KVL_ATTNRES_FUSED_ADD, forward and backward, block ends included): the AttnRes GPU tests and the sm_90a
#       compile test; the small hybrid's step: standard, AttnRes, AttnRes with separate adds (8 rounds, profiled);
#       the small hybrid's step at 10 iterations twice (session 28's final tree for the rest of the model).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session29.sh attnres}" in
attnres)
  attnres_tests 150
  attnres_step 8 170 40 14
  for round in 1 2; do
    mkdir -p "$OUT/round_$round"
    OUT=$OUT/round_$round PART_TAIL=12 part "bench_backbone, round $round" 90 python3 -m kimi_vl.benchmarks.bench_backbone \
      --train-seqs 4096 --decode-contexts --iters 10 --profile --variants hybrid
  done
  ;;
esac
ls -la "$OUT"
