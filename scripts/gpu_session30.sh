#!/usr/bin/env bash
# Session 30's GPU calls (results: docs/results/gpu-<date>-s30/):
#   bash scripts/gpu_session30.sh timeline   call1: where the small hybrid's training step waits for the host
#       (kimi_vl.benchmarks.step_timeline): standard and block AttnRes at 8 x 4096, plain rounds against rounds queued
#       behind a sleep kernel (the device-bound step), host and GPU time of forward and backward, the GPU's lag at each
#       layer, and one step of each under cProfile.
#   bash scripts/gpu_session30.sh gaps       call2: the same with one profiled step of each behind the sleep kernel:
#       the idle time between its kernels, by the kernel that ended each wait (call1: AttnRes's device-bound step is
#       1 ms further above its kernel sum than the standard's).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session30.sh timeline|gaps}" in
timeline)
  PART_TAIL=80 part "step timeline, 8 x 4096" 300 python3 -m kimi_vl.benchmarks.step_timeline --rounds 6 --steps 4 \
    --head-start-ms 300 --cprofile 40
  ;;
gaps)
  PART_TAIL=80 part "step timeline with device gaps, 8 x 4096" 300 python3 -m kimi_vl.benchmarks.step_timeline \
    --rounds 3 --steps 4 --head-start-ms 500 --gaps 25
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
