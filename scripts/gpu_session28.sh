#!/usr/bin/env bash
# Session 28's GPU calls (results: docs/results/gpu-<date>-s28/), prepared at the end of session 27:
#   bash scripts/gpu_session28.sh model   call1: session 27's final defaults (the KDA backward's dH, dVnew and dY in
#       bf16, call7's launches), which its five-shape and model runs (call5) predate: the KDA GPU tests; the five
#       shapes against fla; the small hybrid's step profile twice; block AttnRes's step overhead.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session28.sh model}" in
model)
  install_fla
  mkdir -p "$OUT"/round_1 "$OUT"/round_2
  kda_tests 120
  bench_five 140
  for round in 1 2; do OUT=$OUT/round_$round backbone_profile 70; done
  attnres_step 8 120 30 12
  ;;
esac
ls -la "$OUT"
