#!/usr/bin/env bash
# Session 29's GPU calls (results: docs/results/gpu-<date>-s29/), prepared at the end of session 28:
#   bash scripts/gpu_session29.sh model   call1: session 28's final tree (the small map padded, the fused add + norm,
#       the short conv's streaming one-kernel backward; the small map's gradient now assembled by one split, not
#       timed): the KDA and short-conv GPU tests, the five KDA shapes against fla, the small hybrid's step at 10
#       iterations twice, block AttnRes's step overhead.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session29.sh model}" in
model)
  install_fla
  kda_tests 150 tests/kernels/test_short_conv_triton.py tests/model/test_kda_layer_backends.py
  bench_five 140
  for round in 1 2; do
    mkdir -p "$OUT/round_$round"
    OUT=$OUT/round_$round PART_TAIL=12 part "bench_backbone, round $round" 90 python3 -m kimi_vl.benchmarks.bench_backbone \
      --train-seqs 4096 --decode-contexts --iters 10 --profile --variants hybrid
  done
  attnres_step 8 150 30 12
  ;;
esac
ls -la "$OUT"
