#!/usr/bin/env bash
# Session 25's GPU calls (results: docs/results/gpu-2026-11-29-s25/):
# Modes flip, pair and unroll name options removed or changed after they ran: they are the records of those calls.
#   bash scripts/gpu_session25.sh flip    call1: the two options prepared in session 24 and never run on a GPU:
#       SCORES2_PAIR_AFTER (the scores kernel's pairwise diagonal path after its loop, no branch in the loop) at two
#       shapes, BWD_EE_FROM_G="16bit" (the inter-chunk backward's exponent as G_last - G, no reverse scan); then the
#       KDA GPU tests in a copy of the tree with both switched on.
#   bash scripts/gpu_session25.sh bwdprof call2: BWD_EE_FROM_G="16bit" the default (SCORES2_PAIR_AFTER removed): the five
#       shapes against fla; Nsight Compute (stall reasons by source line) on our backward's pair and inter-chunk
#       kernels and fla's two largest backward kernels; per-kernel times of a training step of each at 1x8192x32.
#   bash scripts/gpu_session25.sh pair    call3: the backward's pair kernel without its spills (call2: 255 registers,
#       9.5 M local-memory requests; ptxas: the pairwise diagonal path's 16 unrolled steps): that path as a loop (the
#       new default), the off-diagonal part one sub-block at a time (BWD_PAIR_BLOCKS), launches, at two shapes; the
#       KDA GPU tests in a copy with BWD_PAIR_BLOCKS on, then in the tree as it is. (The option was removed after
#       call3, its "on" the kernel's only form, so this mode is the record of call3.)
#   bash scripts/gpu_session25.sh final   call4: the committed kernels (pair kernel one sub-block at a time at 4 warps):
#       KDA GPU tests, the five shapes against fla, the backward's launches around the new default.
#   bash scripts/gpu_session25.sh model   call5: the small hybrid's MFU (issue 5) and block-AttnRes step overhead
#       (issue 6) with this session's KDA kernels.
#   bash scripts/gpu_session25.sh unroll  call6: call5's model profile had the pair kernel slower than session 24's
#       (10.47 against 8.13 ms a step) although the kernel benchmark had it faster: the pairwise diagonal path as a
#       loop vs unrolled (BWD_PAIR_UNROLL 1, 16, 4, 2) in the small hybrid's step profile and in the kernel sweep.
#       (The default became 4 after call6, so the mode's edit of "BWD_PAIR_UNROLL = 1" no longer applies: its record.)
#   bash scripts/gpu_session25.sh last    call7: BWD_PAIR_UNROLL = 4 the default: KDA GPU tests, the small hybrid's MFU
#       and profile, the block-AttnRes step overhead.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session25.sh flip|bwdprof|pair|final|model|unroll|last}" in
flip)
  install_fla
  sweep_best 1x8192x32 90 "scores pair after,default again"
  sweep_best 2x16384x16 90 "scores pair after,default again"
  bwd_sweep 1x8192x32 100 "inter ee diff,default again"  # (call1 wrote it to $OUT/bwd)
  flipped_tree kernels/kda/chunk_triton.py 's/^SCORES2_PAIR_AFTER = False/SCORES2_PAIR_AFTER = True/' \
    kernels/kda/chunk_triton_bwd.py 's/^BWD_EE_FROM_G = "never"/BWD_EE_FROM_G = "16bit"/'
  (cd /tmp/flip && PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} kda_tests 150)
  ;;
bwdprof)
  install_fla
  bench_five 150
  NCU_COUNT=8 NCU_IMPLS="ours fla" NCU_EXTRA="--section SourceCounters" PART_TAIL=100 part \
    "ncu: our pair and inter kernels, fla's backward intra and wy_dqkg kernels" 200 bash kernels/benchmarks/ncu_kda.sh \
    "_bwd_intra_pair_kernel|_bwd_inter_kernel|chunk_kda_bwd_kernel_intra|chunk_kda_bwd_kernel_wy_dqkg_fused"
  PART_TAIL=12 part "step kernels of ours and fla at 1x8192x32" 70 python3 kernels/benchmarks/bench_kda.py --no-prelude \
    --profile --impls ours,fla --shapes 1x8192x32 --out "$OUT/bench_kda_profile.json"
  ;;
pair)
  settings="pair unroll,pair blocks,pair blocks w4,pair blocks w4 bk64,pair blocks w4 bk16,pair blocks w4 s2,pair w4"
  bwd_sweep 1x8192x32 120 "$settings,default again"
  bwd_sweep 8x2048x16 100 "$settings,default again"
  flipped_tree kernels/kda/chunk_triton_bwd.py 's/^BWD_PAIR_BLOCKS = False/BWD_PAIR_BLOCKS = True/'
  (cd /tmp/flip && PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} kda_tests 140)
  kda_tests 140
  ;;
final)
  install_fla
  kda_tests 140
  bench_five 150
  bwd_sweep 1x8192x32 120 "inter ee scan,pair w2,pair w4 s2,pair w8,inter w8,inter bk16,inter bv32,default again"
  ;;
unroll)
  install_fla
  bwd_sweep 1x8192x32 110 "pair unroll 16,pair unroll 4,pair unroll 2,diag pairwise,pair diag pairwise unroll 16,default again"
  for u in 1 16 4; do
    flipped_tree kernels/kda/chunk_triton_bwd.py "s/^BWD_PAIR_UNROLL = 1$/BWD_PAIR_UNROLL = $u/"
    (cd /tmp/flip && OUT=$OUT/unroll$u PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} backbone_profile 70)
    grep -h -A3 '"kda"' "$OUT/unroll$u/bench_backbone.json" | head -n 2 | tee -a "$LOG"
  done
  ;;
last)
  kda_tests 120
  backbone_profile 70
  attnres_step 8 120 40 12
  ;;
model)
  backbone_profile 80
  attnres_step 8 190 40 12
  ;;
esac
ls -la "$OUT"
