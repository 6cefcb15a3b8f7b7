#!/usr/bin/env bash
# Session 22's GPU calls (results: docs/results/gpu-2026-11-29-s22/); calls 1-2 ran gpu_session21.sh attnres / profile.
#   bash scripts/gpu_session22.sh confirm   the KDA GPU tests after the split-prep and per-sub-block scores options
#       were removed (the default kernels compile to the same registers: ptxas_regs.py prep 94, scores2 168 / 372 B of
#       spills), then issue 6's number on the flavor it names: the `small` hybrid's block-AttnRes training-step
#       overhead over 6 interleaved rounds (each round's ratio kept, not only the best), with the kernel-time
#       difference of one profiled step.
#   bash scripts/gpu_session22.sh shapes    issue 4: where the forward's gap to fla lies at the shapes the launch settings
#       were not swept at (all sweeps so far ran at 1x8192x32): sweep_kda_fwd.py at 8x2048x16 (the largest gap, 1.09x)
#       and 1x32768x16 (1.00x) over the state / scores / prep / output settings, fla's kernels beside ours.
#   bash scripts/gpu_session22.sh stateblk  issue 4: the forward state pass's value-column block now chosen by the
#       number of (sequence, head) pairs (state_common.state_block_v: 64 columns at 8x2048x16 and 4x4096x32, 16 at
#       the other three shapes; "shapes" measured 0.152 against 0.204 ms at 8x2048x16): KDA GPU tests, the same choice
#       for the backward's reverse state pass swept against its fixed 32 columns, the five shapes against fla.
#   bash scripts/gpu_session22.sh final     the backward's reverse state pass on the same rule (choices 64 / 32: stateblk's
#       sweep had 16 columns slower at both shapes): KDA GPU tests, the five shapes against fla, the small hybrid's
#       training step (MFU, kernels by category).
#   bash scripts/gpu_session22.sh flush     issue 6: the deferred-gradient flush with its dh tiles loaded once per pass over a
#       group of sources (FLUSH_GROUP = 4, 12 elements a thread; was: once per source) against the old form
#       (FLUSH_GROUP = 1, 24 elements) and other groups, kernels alone at 6 mixes into 2 / 4 sources; the small
#       hybrid's AttnRes step overhead with the new default; AttnRes and KDA GPU tests.
# Part limits sum to 380 s (confirm), 360 s (shapes), 500 s (stateblk), 400 s (final) and 400 s (flush); one command
# may run 600.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session22.sh confirm|shapes|stateblk|final|flush}" in
confirm)
  kda_tests 130 tests/model/test_kda_layer_backends.py
  PART_TAIL=60 part "bench_attnres: the small hybrid's block-AttnRes step overhead, 6 rounds, profiled" 250 python3 \
    -m kimi_vl.benchmarks.bench_attnres --layouts hybrid --sources 4 --rounds 6 --hybrid-iters 4 --decode-steps 0 \
    --profile --profile-top 20 --budget-s 400
  ;;
shapes)
  install_fla
  settings="scores s2,scores nreg192,scores bk32,wu 64,state bv32,state s2,state w2,state bv64,prep s1,prep bk64,\
prep w8,out bv128 w8"
  sweep_best 8x2048x16 180 "$settings"
  sweep_best 1x32768x16 180 "$settings"
  ;;
stateblk)
  install_fla
  kda_tests 130 tests/model/test_kda_layer_backends.py
  for shape in 8x2048x16 1x8192x32; do
    mkdir -p "$OUT/$shape"
    PART_TAIL=8 part "sweep_kda_bwd at $shape: reverse state pass block" 80 python3 kernels/benchmarks/sweep_kda_bwd.py \
      --shape "$shape" --only "state bv16,state bv64,state auto" --out "$OUT/$shape/sweep_kda_bwd.json"
  done
  bench_five 200
  ;;
final)
  install_fla
  kda_tests 130 tests/model/test_kda_layer_backends.py
  bench_five 200
  backbone_profile 70
  ;;
flush)
  PART_TAIL=8 part "AttnRes tests on the GPU" 90 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py
  PART_TAIL=30 part "bench_attnres: flush kernels alone, the small hybrid's step overhead (6 rounds)" 200 python3 \
    -m kimi_vl.benchmarks.bench_attnres --sources 3 5 --bwd-sweep --sweep-kernels flush --layouts hybrid --rounds 6 \
    --hybrid-iters 4 --decode-steps 0 --budget-s 400
  kda_tests 110 tests/model/test_kda_layer_backends.py
  ;;
esac
ls -la "$OUT"
