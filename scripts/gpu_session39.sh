#!/usr/bin/env bash
# Session 39's GPU calls (results: docs/results/gpu-2026-12-07-s39/):
#   bash scripts/gpu_session39.sh check   call1: the KDA GPU tests on session 38's default (the q, k norms from the
#       scores kernel, never tested on a GPU), bench_kda.py --graph ours vs fla at the issue's five shapes, the
#       cross entropy GPU tests (session 37's kernel, not yet tested on a GPU).
#   bash scripts/gpu_session39.sh pieces  call2: the forward in pieces along time (kernels/kda/pieces.py, FWD_PIECES),
#       the state pass of each piece beside the next piece's scores: its GPU test (bit-equal to one piece, CUDA graph
#       capture), then sweep_kda_fwd.py of piece counts and state widths at 1x32768x16, 2x16384x16 and 1x8192x32.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session39.sh check|pieces}" in
check)  # (the most telling parts first: the call may end at the session's last device time)
  install_fla
  kda_tests 150
  bench_five 200
  PART_TAIL=8 part "cross entropy tests on the GPU" 90 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_cross_entropy.py tests/kernels/test_linear_cross_entropy.py tests/kernels/test_cross_entropy_compiles.py
  ;;
pieces)
  install_fla
  PART_TAIL=8 part "pieces GPU test" 60 python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_kda_pieces.py
  fwd_sweep 1x32768x16 150 "default,pieces 2,pieces 4,pieces 8,pieces 16,pieces 4 bv32,pieces 8 bv32,pieces 4 bv64,pieces 8 bv64,default again"
  fwd_sweep 2x16384x16 100 "default,pieces 2,pieces 4,pieces 8,pieces 4 bv32,pieces 4 bv64,default again"
  fwd_sweep 1x8192x32 80 "default,pieces 2,pieces 4,pieces 4 bv64,default again"
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
