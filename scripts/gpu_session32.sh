#!/usr/bin/env bash
# Session 32's GPU calls (results: docs/results/gpu-<date>-s32/):
#   bash scripts/gpu_session32.sh norm   call1: the block-AttnRes training mixes apply their sublayer's input RMSNorm
#       in the forward kernel (mix_triton.FWD_NORM, mix_autograd.AttnResMixNormTriton: y written beside h, the norm's
#       own forward launch gone): the AttnRes GPU tests (kernels and the model's), and the small hybrid's block-AttnRes
#       step profiled with it and with --set FWD_NORM=False, interleaved twice, 4 rounds each.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session32.sh norm}" in
norm)
  PART_TAIL=6 part "AttnRes kernel and model tests on the GPU" 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/kernels/test_attnres_compiles.py tests/model/test_attn_res.py
  for round in a b; do
    attnres_candidate "norm_$round" 12 8
    attnres_candidate "sep_$round" 12 8 --set FWD_NORM=False
  done
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
