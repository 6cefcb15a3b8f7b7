#!/usr/bin/env bash
# Session 25's GPU calls (results: docs/results/gpu-2026-11-29-s25/):
#   bash scripts/gpu_session25.sh flip    call1: the two options prepared in session 24 and never run on a GPU:
#       SCORES2_PAIR_AFTER (the scores kernel's pairwise diagonal path after its loop, no branch in the loop) at two
#       shapes, BWD_EE_FROM_G="16bit" (the inter-chunk backward's exponent as G_last - G, no reverse scan); then the
#       KDA GPU tests in a copy of the tree with both switched on.
set -u
source "$(dirname "$0")/gpu_parts.sh"

flipped_tree() {  # a copy of the tree at /tmp/flip with both session-24 options on
  rm -rf /tmp/flip && cp -r . /tmp/flip
  sed -i 's/^SCORES2_PAIR_AFTER = False/SCORES2_PAIR_AFTER = True/' /tmp/flip/kernels/kda/chunk_triton.py
  sed -i 's/^BWD_EE_FROM_G = "never"/BWD_EE_FROM_G = "16bit"/' /tmp/flip/kernels/kda/chunk_triton_bwd.py
  grep -n "^SCORES2_PAIR_AFTER\|^BWD_EE_FROM_G" /tmp/flip/kernels/kda/chunk_triton*.py | tee -a "$LOG"
}

gpu_header
case "${1:?usage: gpu_session25.sh flip}" in
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
esac
ls -la "$OUT"
