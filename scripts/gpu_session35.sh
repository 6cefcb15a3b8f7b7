#!/usr/bin/env bash
# Session 35's GPU calls (results: docs/results/gpu-2026-11-30-s35/):
#   bash scripts/gpu_session35.sh micro   call1: the AttnRes mix with its sublayer's RMSNorm in one kernel, forward and
#       backward (kernels/attn_res/mix_norm_triton.py), against the mix and the norm one after the other, at the small
#       flavor's 8 x 4096 x 768 for 2-5 sources (kernels/benchmarks/bench_mix_norm.py; the fused backward also at 1 and
#       3 programs an SM and without software pipelining).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session35.sh micro}" in
micro)
  PART_TAIL=30 part "bench_mix_norm" 240 python3 kernels/benchmarks/bench_mix_norm.py \
    --fused-set BWD_PROGRAMS_PER_SM=1 BWD_PROGRAMS_PER_SM=3 BWD_STAGES=1
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
