#!/usr/bin/env bash
# Session 34's GPU calls (results: docs/results/gpu-2026-11-30-s34/):
#   bash scripts/gpu_session33.sh nogate   call1: the training backward without the fp32 log-decay's recompute
#       (session 33's last mode, run first here).
#   bash scripts/gpu_session34.sh dots     call2: block AttnRes's deferred gradients with the score products in the
#       block's flush (kernels/attn_res/defer_triton.py, mix_triton.FLUSH_DOTS): the AttnRes GPU tests (with the bf16
#       stream against fp64 both ways, printed), then the small hybrid's block-AttnRes step (bench_attnres, 4 rounds,
#       profiled) with it, without it (--set FLUSH_DOTS=False), with the flush's other settings, and both again.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session34.sh dots}" in
dots)
  PART_TAIL=6 part "AttnRes GPU tests" 150 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_defer.py tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py
  PART_TAIL=4 part "bf16 stream vs fp64, products in the flush and per mix" 90 python3 -m pytest -q -s \
    -p no:cacheprovider tests/kernels/test_attn_res_defer.py -k bf16_products
  attnres_candidate dots_a 12 8
  attnres_candidate nodots_a 12 8 --set FLUSH_DOTS=False
  attnres_candidate dots_g1 12 8 --set FLUSH_DOTS_GROUP=1
  attnres_candidate dots_te6 12 8 --set FLUSH_DOTS_THREAD_ELEMS=6
  attnres_candidate dots_b 12 8
  attnres_candidate nodots_b 12 8 --set FLUSH_DOTS=False
  ;;
esac
