#!/usr/bin/env bash
# Session 41's GPU calls (results: docs/results/gpu-2026-12-07-s41/), all on one H100 at a8bbe6e:
#   bash scripts/gpu_session41.sh five      call1: session 39's final shape rule for the forward in pieces (never run
#       at all five shapes before): the pieces GPU test, then bench_kda.py --graph ours vs fla at the issue's five shapes.
#   bash scripts/gpu_session41.sh attnres   call2: block AttnRes's step overhead on the small hybrid (4 rounds, profiled).
#   bash scripts/gpu_session41.sh backbone  call3: the small hybrid's profiled training step (MFU at 4096).
# (calls 2 and 3 ran as `source scripts/gpu_parts.sh && attnres_step 4 300 40 12` and `... && backbone_profile 170`,
# the same commands as these modes, without the GPU header)
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session41.sh five|attnres|backbone}" in
five)
  install_fla
  PART_TAIL=8 part "pieces GPU test" 100 python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_kda_pieces.py
  bench_five 200
  ;;
attnres)
  attnres_step 4 300 40 12
  ;;
backbone)
  backbone_profile 170
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
