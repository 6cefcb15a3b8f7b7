#!/usr/bin/env bash
# Prepared in session 19 for the next session's GPU call (results: docs/results/gpu-<date>-s20/):
#   bash scripts/gpu_session20.sh prep   the KDA prep kernel, the forward's largest gap to fla (0.326 ms against fla's
#       0.155 for the same work at 1 x 8192 x 32 on an H200, session 19 call3): its first pass (the q, k row norms) in
#       64- or 128-column steps (PREP_NORM_BK; 189 / 194 registers against 155, so 2 CTAs a multiprocessor instead of
#       3), alone and with 16-column main steps; the KDA forward tests on the GPU first (the CPU interpreter tests the
#       64-column form at K = 48); then bench_kda.py at the five shapes with the best setting.
# Part limits sum to 480 s (one command may run 600).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session20.sh prep}" in
prep)
  install_fla
  kda_tests 100
  sweep_best 1x8192x32 150 "prep norm bk64,prep norm bk128,prep norm bk128 bk16,prep bk16"
  bench_five 230 "$OUT/1x8192x32/best.txt"
  ;;
esac
ls -la "$OUT"
