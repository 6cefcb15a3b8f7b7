#!/usr/bin/env bash
# Session 25's GPU calls (results: docs/results/gpu-2026-11-29-s25/):
#   bash scripts/gpu_session25.sh flip    call1: the two options prepared in session 24 and never run on a GPU:
#       SCORES2_PAIR_AFTER (the scores kernel's pairwise diagonal path after its loop, no branch in the loop) at two
#       shapes, BWD_EE_FROM_G="16bit" (the inter-chunk backward's exponent as G_last - G, no reverse scan); then the
#       KDA GPU tests in a copy of the tree with both switched on.
#   bash scripts/gpu_session25.sh bwdprof call2: BWD_EE_FROM_G="16bit" the default (SCORES2_PAIR_AFTER removed): the five
#       shapes against fla; Nsight Compute (stall reasons by source line) on our backward's pair and inter-chunk
#       kernels and fla's two largest backward kernels; per-kernel times of a training step of each at 1x8192x32.
set -u
source "$(dirname "$0")/gpu_parts.sh"

flipped_tree() {  # a copy of the tree at /tmp/flip with both session-24 options on
  rm -rf /tmp/flip && cp -r . /tmp/flip
  sed -i 's/^SCORES2_PAIR_AFTER = False/SCORES2_PAIR_AFTER = True/' /tmp/flip/kernels/kda/chunk_triton.py
  sed -i 's/^BWD_EE_FROM_G = "never"/BWD_EE_FROM_G = "16bit"/' /tmp/flip/kernels/kda/chunk_triton_bwd.py
  grep -n "^SCORES2_PAIR_AFTER\|^BWD_EE_FROM_G" /tmp/flip/kernels/kda/chunk_triton*.py | tee -a "$LOG"
}

gpu_header
case "${1:?usage: gpu_session25.sh flip|bwdprof}" in
flip)
  install_fla
  sweep_best 1x8192x32 90 "scores pair after,default again"
  sweep_best 2x16384x16 90 "scores pair after,default again"
  mkdir -p "$OUT/bwd"
  PART_TAIL=16 part "sweep_kda_bwd at 1x8192x32: inter ee diff" 100 python3 kernels/benchmarks/sweep_kda_bwd.py \
    --shape 1x8192x32 --only "inter ee diff,default again" --out "$OUT/bwd/sweep_kda_bwd.json"
  flipped_tree
  (cd /tmp/flip && PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} kda_tests 150)
  ;;
bwdprof)
  install_fla
  bench_five 150
  NCU_COUNT=8 NCU_IMPLS="ours fla" NCU_EXTRA="--section SourceCounters" PART_TAIL=100 part \
    "ncu: our pair and inter kernels, fla's backward intra and wy_dqkg kernels" 200 bash kernels/benchmarks/ncu_kda.sh \
    "_bwd_intra_pair_kernel|_bwd_inter_kernel|chunk_kda_bwd_kernel_intra|chunk_kda_bwd_kernel_wy_dqkg_fused"
  PART_TAIL=12 part "step kernels of ours and fla at 1x8192x32" 70 python3 kernels/benchmarks/bench_kda.py --no-prelude \
    --profile --impls ours,fla --shapes 1x8192x32 --out "$OUT/bench_kda_profile.json"
  ;;
esac
ls -la "$OUT"
