#!/usr/bin/env bash
# Session 29's GPU calls (results: docs/results/gpu-<date>-s29/):
#   bash scripts/gpu_session29.sh attnres   call1: block AttnRes's running sums added inside the mix kernels
#       (KVL_ATTNRES_FUSED_ADD, forward and backward, block ends included): the AttnRes GPU tests and the sm_90a
#       compile test; the small hybrid's step: standard, AttnRes, AttnRes with separate adds (8 rounds, profiled);
#       the small hybrid's step at 10 iterations twice (session 28's final tree for the rest of the model).
#   bash scripts/gpu_session29.sh hostab    call2: call1's AttnRes steps took 13 ms more than their kernels (the
#       standard 4 ms): this tree against session 28's final one (1671cb5, carried in old/), block AttnRes's step at
#       1 x 256 tokens (the step's host time: its kernels take little) and at 8 x 4096, interleaved by tree.
#   (call1's running-sum fusion was reverted after call2: no gain, as session 12 had found.)
#   bash scripts/gpu_session29.sh launch    call3: the training mix kernels called directly after their first launch
#       (kernels/fast_launch.py, KVL_FAST_LAUNCH): the AttnRes GPU tests; block AttnRes's step with and without it at
#       1 x 256 (host-bound; with the decode stream's host cost) and at 8 x 4096 (8 rounds, profiled).
#   bash scripts/gpu_session29.sh expand    call4: MLA's keys and values through kernels/mla_expand.py's kernels
#       (KVL_MLA_EXPAND_BACKEND): its GPU tests; the small hybrid's step with the PyTorch form and with the kernels,
#       interleaved twice (10 iterations, profiled).
#   bash scripts/gpu_session29.sh final     call5: the KDA backward writes dv into the q|k|v gradient's v third (no
#       copy): the KDA and MLA GPU tests; the five KDA shapes against fla; the small hybrid's step at 10 iterations
#       twice and block AttnRes's step overhead, on this session's final tree.
#   bash scripts/gpu_session29.sh sync      call6: the small hybrid's step once more, with the host-device
#       synchronisation of a step named by its caller outside torch (kernels.profiling.sync_sites).
#   bash scripts/gpu_session29.sh findsync  call7: that synchronisation's traceback (scripts/find_sync.py, the sync
#       debug mode set to raise), forward and backward of the small hybrid at 8 x 4096.
#   bash scripts/gpu_session29.sh launchab  call8: the decode stream's host cost per token and per phase-2 launch
#       (bench_attnres --stream-cost) on this tree and session 28's (old/), interleaved twice: did the shared launcher
#       (kernels/fast_launch.py) slow the two-phase decode launches?
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session29.sh attnres|hostab|launch|expand|final|sync|findsync|launchab}" in
attnres)
  attnres_tests 150
  attnres_step 8 170 40 14
  for round in 1 2; do
    mkdir -p "$OUT/round_$round"
    OUT=$OUT/round_$round PART_TAIL=12 part "bench_backbone, round $round" 90 python3 -m kimi_vl.benchmarks.bench_backbone \
      --train-seqs 4096 --decode-contexts --iters 10 --profile --variants hybrid
  done
  ;;
hostab)
  for size in "256 1 8" "4096 8 4"; do
    set -- $size
    for tree in new old; do
      dir=.; [ $tree = old ] && dir=old
      mkdir -p "$OUT/${tree}_$1"
      (cd $dir && OUT=$OUT/${tree}_$1 PART_TAIL=6 part "bench_attnres, $tree tree, $2 x $1" 150 env PYTHONPATH="$PWD:/tmp/site" \
        python3 -m kimi_vl.benchmarks.bench_attnres --layouts hybrid --sources 3 --rounds 6 --hybrid-iters "$3" \
        --decode-steps 0 --seq "$1" --batch "$2" --budget-s 400)
    done
  done
  ;;
launch)
  PART_TAIL=8 part "AttnRes and launch tests on the GPU" 150 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py tests/kernels/test_fast_launch.py
  mkdir -p "$OUT/tiny"
  OUT=$OUT/tiny PART_TAIL=14 part "bench_attnres at 1 x 256: the host-bound step, and the decode stream's host cost" 150 \
    python3 -m kimi_vl.benchmarks.bench_attnres --layouts hybrid --sources 3 --rounds 6 --hybrid-iters 8 \
    --decode-steps 0 --seq 256 --batch 1 --stream-cost --budget-s 400
  attnres_step 8 170 40 14
  ;;
expand)
  PART_TAIL=8 part "MLA expand tests on the GPU" 150 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_mla_expand.py tests/model/test_moe_mla.py tests/model/test_backbone_invariants.py
  for round in 1 2; do
    for backend in torch triton; do
      mkdir -p "$OUT/${backend}_$round"
      OUT=$OUT/${backend}_$round PART_TAIL=14 part "bench_backbone, MLA expand $backend, round $round" 90 \
        env KVL_MLA_EXPAND_BACKEND=$backend python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 \
        --decode-contexts --iters 10 --profile --variants hybrid
    done
  done
  ;;
final)
  install_fla
  kda_tests 150 tests/model/test_kda_layer_backends.py tests/kernels/test_mla_expand.py tests/model/test_moe_mla.py
  bench_five 140
  for round in 1 2; do
    mkdir -p "$OUT/round_$round"
    OUT=$OUT/round_$round PART_TAIL=12 part "bench_backbone, round $round" 90 python3 -m kimi_vl.benchmarks.bench_backbone \
      --train-seqs 4096 --decode-contexts --iters 10 --profile --variants hybrid
  done
  attnres_step 8 170 30 12
  ;;
sync)
  PART_TAIL=12 part "bench_backbone" 90 python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 \
    --decode-contexts --iters 10 --profile --variants hybrid
  ;;
findsync)
  PART_TAIL=80 part "find_sync.py" 120 python3 scripts/find_sync.py
  ;;
launchab)
  for round in 1 2; do
    for tree in new old; do
      dir=.; [ $tree = old ] && dir=old
      mkdir -p "$OUT/${tree}_$round"
      (cd $dir && OUT=$OUT/${tree}_$round PART_TAIL=3 part "stream cost, $tree tree, round $round" 60 \
        env PYTHONPATH="$PWD:/tmp/site" python3 -m kimi_vl.benchmarks.bench_attnres --stream-cost --sources 2 \
        --layouts --decode-steps 0)
    done
  done
  ;;
esac
ls -la "$OUT"
