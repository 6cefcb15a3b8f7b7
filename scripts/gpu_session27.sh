#!/usr/bin/env bash
# Session 27's GPU calls (results: docs/results/gpu-<date>-s27/), prepared at the end of session 26:
#   bash scripts/gpu_session27.sh first   call1: two forward options prepared in session 26, interpreter-tested only:
#       the scores kernel reading the prep kernel's spans (INTRA_SPAN_FROM_PREP: a scalar load a K tile instead of the
#       [64, 16] cross-warp reduction) and the state pass writing the output (STATE_OUT: no output kernel), against
#       the default at 1x8192x32 and 2x16384x16 with the benchmark's gates and at the model's 8x4096x6 with its gates
#       and fp32 beta; the forward-only kernels' profile with STATE_OUT; the KDA GPU tests in a copy with both on.
#   bash scripts/gpu_session27.sh more    call2 (if call1's sweeps favour the options; drop the flipped_tree pair of
#       one that lost): the five shapes against fla with them on, and the small hybrid's step profile with them off /
#       on, interleaved twice.
#   bash scripts/gpu_session27.sh bwd     the reverse state pass storing dH in bf16 (BWD_DH_16BIT, prepared in session
#       26, interpreter-tested only) at 1x8192x32 and at the model's shape, gates and beta dtype; the KDA GPU tests in
#       a copy with it on.
#   (first and bwd ran as calls 1 and 2 at c903b64; the two forward options are since removed, BWD_DH_16BIT is the
#   default and its setting is now "state dh32", so those two modes no longer run as written)
#   bash scripts/gpu_session27.sh confirm   call3: with dH in bf16 the default, the inter kernel's Vnew dH^T as a bf16
#       dot (both operands bf16 now) against the tf32 dot of their fp32 copies (a copy with the branch sed'ed off) at
#       1x8192x32 and the model's shape, interleaved; the KDA GPU tests.
#   bash scripts/gpu_session27.sh dvn       call4 (at d0cd848; its setting is now "dvn32", the other way round): dVnew and dY stored in bf16 (BWD_DVN_16BIT, interpreter-tested only)
#       at 1x8192x32 and the model's shape; the KDA GPU tests in a copy with it on.
#   bash scripts/gpu_session27.sh launch    call6: with dVnew, dY and dH in bf16 (fewer registers in three kernels), the
#       backward's launch settings around the default again, at 1x8192x32 and the model's shape.
#   bash scripts/gpu_session27.sh check     call7: call6's three winners together (the reverse state pass at 64 columns
#       from 0.6 programs an SM, the dY kernel at 1 stage, the inter kernel at 3) against call6's default; KDA tests.
#   bash scripts/gpu_session27.sh final     call5: BWD_DVN_16BIT the default: its errors against fp64 beside fla's
#       and dVnew in fp32 at 1x8192x32; the five shapes against fla; the small hybrid's step profile twice; block
#       AttnRes's step overhead.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session27.sh first|more|bwd|confirm|dvn|final|launch|check}" in
first)
  install_fla
  settings="span from prep,state out,state out bv16,state out bv64,span from prep + state out,default again"
  fwd_sweep 1x8192x32 120 "$settings"
  fwd_sweep 2x16384x16 120 "$settings"
  fwd_sweep 8x4096x6 90 "$settings" init fp32 --no-fla  # (fla autotunes for minutes at 6 heads)
  flipped_tree kernels/kda/chunk_triton.py 's/^INTRA_SPAN_FROM_PREP = False/INTRA_SPAN_FROM_PREP = True/' \
    kernels/kda/chunk_triton.py 's/^STATE_OUT = False/STATE_OUT = True/'
  (cd /tmp/flip && PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} PART_TAIL=20 part \
    "bench_kda --profile at 1x8192x32 with both on (forward-only kernels)" 60 python3 kernels/benchmarks/bench_kda.py \
    --no-prelude --profile --impls ours --shapes 1x8192x32 --out "$OUT/bench_kda_profile_flip.json")
  (cd /tmp/flip && PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} kda_tests 120)
  ;;
more)
  install_fla
  flipped_tree kernels/kda/chunk_triton.py 's/^INTRA_SPAN_FROM_PREP = False/INTRA_SPAN_FROM_PREP = True/' \
    kernels/kda/chunk_triton.py 's/^STATE_OUT = False/STATE_OUT = True/'
  mkdir -p "$OUT"/options "$OUT"/default_1 "$OUT"/default_2 "$OUT"/options_1 "$OUT"/options_2
  (cd /tmp/flip && OUT=$OUT/options PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} bench_five 140)
  for round in 1 2; do
    OUT=$OUT/default_$round backbone_profile 70
    (cd /tmp/flip && OUT=$OUT/options_$round PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} backbone_profile 70)
  done
  ;;
confirm)
  mkdir -p "$OUT"/tf32dot
  flipped_tree kernels/kda/chunk_triton_bwd.py 's/if dH_ptr.dtype.element_ty == vn_ptr.dtype.element_ty:/if False:/'
  for args in "1x8192x32 100" "8x4096x6 100 init fp32"; do
    read -r shape limit gates beta <<<"$args"
    bwd_sweep "$shape" "$limit" "default again" "$gates" "$beta"
    (cd /tmp/flip && OUT=$OUT/tf32dot PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} \
      bwd_sweep "$shape" "$limit" "default again" "$gates" "$beta")
  done
  kda_tests 120
  ;;
dvn)
  bwd_sweep 1x8192x32 120 "dvn16,default again"
  bwd_sweep 8x4096x6 120 "dvn16,default again" init fp32
  flipped_tree kernels/kda/chunk_triton_bwd.py 's/^BWD_DVN_16BIT = False/BWD_DVN_16BIT = True/'
  (cd /tmp/flip && PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} kda_tests 150)
  ;;
check)
  bwd_sweep 1x8192x32 90 "call6 default,default again"
  bwd_sweep 8x4096x6 90 "call6 default,default again" init fp32
  kda_tests 120
  ;;
final)
  install_fla
  mkdir -p "$OUT"/round_1 "$OUT"/round_2
  bwd_sweep 1x8192x32 120 "dvn32,default again" "" "" --fla-errors
  bench_five 140
  for round in 1 2; do OUT=$OUT/round_$round backbone_profile 70; done
  attnres_step 8 120 30 12
  ;;
launch)
  settings="state s3,state bv64,state bv32,dy s1,dy s3,dy bv64,dy w8,inter w4 s3,inter w4 s1,inter w8,inter bk16"
  settings+=",inter bv32,inter bv128,inter w8 bv128,default again"
  bwd_sweep 1x8192x32 200 "$settings"
  bwd_sweep 8x4096x6 200 "$settings" init fp32
  ;;
bwd)
  bwd_sweep 1x8192x32 120 "state dh16,default again"
  bwd_sweep 8x4096x6 100 "state dh16,default again" init fp32
  flipped_tree kernels/kda/chunk_triton_bwd.py 's/^BWD_DH_16BIT = False/BWD_DH_16BIT = True/'
  (cd /tmp/flip && PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} kda_tests 120)
  ;;
esac
ls -la "$OUT"
