#!/usr/bin/env bash
# Session 41's GPU calls (results: docs/results/gpu-2026-12-07-s41/):
#   bash scripts/gpu_session41.sh five   call1: session 39's final shape rule for the forward in pieces (never run at
#       all five shapes): the pieces GPU test, then bench_kda.py --graph ours vs fla at the issue's five shapes.
#   bash scripts/gpu_session41.sh step   call2: where issues 5 and 6 stand on this tree: the small hybrid's profiled
#       training step (MFU at 4096), then block AttnRes's step overhead (6 rounds, profiled).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session41.sh five|step}" in
five)
  install_fla
  PART_TAIL=8 part "pieces GPU test" 100 python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_kda_pieces.py
  bench_five 200
  ;;
step)
  backbone_profile 150
  attnres_step 6 300 40 12
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
