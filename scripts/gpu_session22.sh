#!/usr/bin/env bash
# Session 22's GPU calls (results: docs/results/gpu-2026-11-29-s22/); calls 1-2 ran gpu_session21.sh attnres / profile.
#   bash scripts/gpu_session22.sh confirm   the KDA GPU tests after the split-prep and per-sub-block scores options
#       were removed (the default kernels compile to the same registers: ptxas_regs.py prep 94, scores2 168 / 372 B of
#       spills), then issue 6's number on the flavor it names: the `small` hybrid's block-AttnRes training-step
#       overhead over 6 interleaved rounds (each round's ratio kept, not only the best), with the kernel-time
#       difference of one profiled step.
# Part limits sum to 380 s; one command may run 600.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session22.sh confirm}" in
confirm)
  kda_tests 130 tests/model/test_kda_layer_backends.py
  PART_TAIL=60 part "bench_attnres: the small hybrid's block-AttnRes step overhead, 6 rounds, profiled" 250 python3 \
    -m kimi_vl.benchmarks.bench_attnres --layouts hybrid --sources 4 --rounds 6 --hybrid-iters 4 --decode-steps 0 \
    --profile --profile-top 20 --budget-s 400
  ;;
esac
ls -la "$OUT"
