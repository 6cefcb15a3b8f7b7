#!/usr/bin/env bash
# Session 34's GPU calls (results: docs/results/gpu-2026-11-30-s34/):
#   bash scripts/gpu_session33.sh nogate   call1: the training backward without the fp32 log-decay's recompute
#       (session 33's last mode, run first here).
#   bash scripts/gpu_session34.sh dots     call2: block AttnRes's deferred gradients with the score products in the
#       block's flush (kernels/attn_res/defer_triton.py, mix_triton.FLUSH_DOTS): the AttnRes GPU tests (with the bf16
#       stream against fp64 both ways, printed), then the small hybrid's block-AttnRes step (bench_attnres, 4 rounds,
#       profiled) with it, without it (--set FLUSH_DOTS=False), with the flush's other settings, and both again (ran at
#       c22745b; slower and less accurate in bf16, reverted in df9e72c: this mode no longer runs).
#   bash scripts/gpu_session34.sh final    call3: the KDA GPU tests; the five shapes against fla-core 0.6.0 (bench_kda
#       --graph) with the backward without the log-decay recompute; bench_backbone --profile of the small hybrid at
#       8 x 4096, 20 steps each way; block AttnRes's step overhead (bench_attnres, 4 rounds).
#   bash scripts/gpu_session34.sh chain    call4: block AttnRes's running sums chained through the mixes (each mix's
#       backward kernel adds its running sum's gradient into the next sum's in place, KVL_ATTNRES_CHAIN_GRAD): the
#       AttnRes GPU tests, then the small hybrid's block-AttnRes step (bench_attnres, 4 rounds, profiled) with it and
#       without it (KVL_ATTNRES_CHAIN_GRAD=0), interleaved, three times each.
#   bash scripts/gpu_session34.sh check    call5: the AttnRes GPU tests at the session's final code, and the training
#       stream's bf16 gradients against fp64 (printed).
#   bash scripts/gpu_session34.sh kernels  call7: every kernel of the small hybrid's profiled training step, with its
#       category (bench_backbone --profile --profile-top 400; what "other" and "copy/cast" hold, for issue 5).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session34.sh final|chain|check|kernels}" in
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
final)
  kda_tests 110
  install_fla
  bench_five 190
  mkdir -p "$OUT/backbone"
  OUT=$OUT/backbone PART_TAIL=14 part "bench_backbone --profile, hybrid at 8 x 4096" 100 python3 -m \
    kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 20 --variants hybrid --profile
  attnres_step 4 140 16 6
  ;;
chain)
  PART_TAIL=6 part "AttnRes GPU tests" 120 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py
  for round in a b c; do
    attnres_candidate chain_$round 12 8
    KVL_ATTNRES_CHAIN_GRAD=0 attnres_candidate nochain_$round 12 8
  done
  ;;
check)
  PART_TAIL=6 part "AttnRes GPU tests" 120 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py
  PART_TAIL=16 part "bf16 training stream against fp64 (printed)" 90 python3 -m pytest -q -s -p no:cacheprovider \
    tests/model/test_attn_res.py -k bf16_gradients_against_fp64
  ;;
kernels)
  mkdir -p "$OUT/backbone"
  OUT=$OUT/backbone PART_TAIL=20 part "bench_backbone --profile, every kernel" 150 python3 -m \
    kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 3 --variants hybrid --profile \
    --profile-top 400
  python3 -c "import json; p = json.load(open('$OUT/backbone/bench_backbone.json'))['profile']['hybrid']
for k in p['top_kernels']:
    if k['category'] in ('other', 'copy/cast', 'elementwise', 'reduce'): print(k['category'], k['calls'], round(k['ms'], 3), k['name'])" \
    | tee -a "$LOG"
  ;;
esac
