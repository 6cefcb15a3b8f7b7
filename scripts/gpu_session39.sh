#!/usr/bin/env bash
# Session 39's GPU calls (results: docs/results/gpu-2026-12-07-s39/):
#   bash scripts/gpu_session39.sh check   call1: the KDA GPU tests on session 38's default (the q, k norms from the
#       scores kernel, never tested on a GPU), bench_kda.py --graph ours vs fla at the issue's five shapes, the
#       cross entropy GPU tests (session 37's kernel, not yet tested on a GPU).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session39.sh check}" in
check)  # (the most telling parts first: the call may end at the session's last device time)
  install_fla
  kda_tests 150
  bench_five 200
  PART_TAIL=8 part "cross entropy tests on the GPU" 90 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_cross_entropy.py tests/kernels/test_linear_cross_entropy.py tests/kernels/test_cross_entropy_compiles.py
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
