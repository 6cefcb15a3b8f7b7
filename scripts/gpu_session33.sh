#!/usr/bin/env bash
# Session 33's GPU calls (results: docs/results/gpu-<date>-s33/):
#   bash scripts/gpu_session33.sh sweep  call1: the short convolution's one-kernel backward with several rows' loads
#       issued per loop iteration (conv_triton.STREAM_STEP) and the forward's tiles (FWD_BT, FWD_BD, FWD_WARPS) at the
#       model's 8 x 4096 x 2304 (bench_short_conv.py --model-only, after the short-conv GPU tests); the KDA backward's
#       inter / dY / reverse-state launch settings at the model's shape (8x4096x6, init gates, fp32 beta) not swept
#       there before; the KDA forward's settings at that shape (sweep_kda_fwd.py, all settings, no fla).
#   bash scripts/gpu_session33.sh state  call2: the forward state pass's width rule at 0.6 programs an SM
#       (chunk_triton.STATE_FILL; 64 columns at the model's shape) and its pipeline stages at 16 and 64 columns, at the
#       model's shape and the benchmark's five (sweep_kda_fwd.py, no fla); the KDA GPU tests; the small hybrid's step
#       profile (bench_backbone --profile).
#   bash scripts/gpu_session33.sh final  call3: with the forward state pass's 64-column programs at 2 stages when they
#       outnumber the SMs (STATE_STAGES_WIDE_MANY): the KDA forward GPU tests; bench_backbone of the small hybrid at
#       8 x 4096, 10 steps after a synchronisation and 10 behind a 300 ms GPU sleep (device-bound); block AttnRes's
#       step overhead (bench_attnres, 4 rounds); the five shapes against fla-core 0.6.0 (bench_kda --graph).
#   bash scripts/gpu_session33.sh gate   call4: the KDA gate backward walking GATE_BWD_TILES blocks a program (its
#       partial sums reduced across warps once; 1 block before): the prep and backward GPU tests; sweep_kda_bwd at the
#       model's shape with 1 / 4 / 8 / 16 blocks; bench_backbone --profile of the small hybrid (10 steps, device-bound)
#       (ran at 146057a; slower, removed in the next commit with its sweep settings: this mode no longer runs).
#   bash scripts/gpu_session33.sh confirm call5: after the gate change's revert, bench_backbone --profile of the small
#       hybrid at 8 x 4096, 20 steps each way, twice; block AttnRes's step overhead (bench_attnres, 4 rounds) again.
#   bash scripts/gpu_session33.sh pair16 call6: the KDA pair kernel's dq, dk parts handed to the inter kernel in bf16
#       (chunk_triton_bwd.BWD_PAIR_16BIT): the KDA backward GPU tests; sweep_kda_bwd with it off and on at the model's
#       shape (init gates, fp32 beta) and at 1x8192x32; bench_backbone --profile of the small hybrid (ran at 4938f7c;
#       slower at 1x8192x32, removed with its sweep setting in the next commit: this mode no longer runs).
#   bash scripts/gpu_session33.sh nogate call7: the training backward without the fp32 log-decay's recompute for 16-bit
#       inputs (chunk_triton_bwd.bwd_reads_g): the KDA backward GPU tests; sweep_kda_bwd's default at the model's shape
#       (its step profile); bench_backbone --profile of the small hybrid. Not run in session 33: its device time left
#       (250 s) could not start another machine; the first call of the next session.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session33.sh sweep|state|final|gate|confirm|pair16|nogate}" in
sweep)
  PART_TAIL=6 part "short-conv GPU tests" 150 python3 -m pytest -q -p no:cacheprovider -rf \
    tests/kernels/test_short_conv_triton.py tests/kernels/test_short_conv.py
  PART_TAIL=24 part "bench_short_conv --model-only" 150 python3 kernels/benchmarks/bench_short_conv.py --model-only \
    --out "$OUT/bench_short_conv.json"
  bwd_sweep 8x4096x6 120 "inter w2,inter w2 bk64,inter w8 bk64,inter w2 bv32,inter w4 bk64,dy w2,dy w2 bv64,state w2,state w8,default again" init fp32
  fwd_sweep 8x4096x6 150 "" init fp32 --no-fla
  ;;
state)
  fwd_sweep 8x4096x6 60 "state fill 1,state bv64 s2,state bv64 s4,state bv64 s1,state bv16 s2,default again" init fp32 \
    --no-fla
  for shape in 1x8192x32 2x16384x16 1x32768x16; do
    fwd_sweep $shape 45 "state bv16 s2,state bv64,state bv64 s2,default again" "" "" --no-fla
  done
  for shape in 8x2048x16 4x4096x32; do
    fwd_sweep $shape 45 "state bv64 s2,state bv16 s2,default again" "" "" --no-fla
  done
  kda_tests 150
  backbone_profile 120
  ;;
final)
  PART_TAIL=6 part "KDA forward tests on the GPU" 100 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_kda_triton.py
  mkdir -p "$OUT/backbone"
  OUT=$OUT/backbone PART_TAIL=14 part "bench_backbone, hybrid at 8 x 4096" 120 python3 -m \
    kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --variants hybrid
  attnres_step 4 170 16 6
  install_fla
  bench_five 190
  ;;
gate)
  PART_TAIL=6 part "KDA prep and backward tests on the GPU" 150 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_kda_prep.py tests/kernels/test_kda_bwd.py
  bwd_sweep 8x4096x6 90 "gate tiles 1,gate tiles 4,gate tiles 16,default again" init fp32
  mkdir -p "$OUT/backbone"
  OUT=$OUT/backbone PART_TAIL=40 part "bench_backbone --profile, hybrid at 8 x 4096" 150 python3 -m \
    kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --variants hybrid --profile
  ;;
confirm)
  for round in a b; do
    mkdir -p "$OUT/backbone_$round"
    OUT=$OUT/backbone_$round PART_TAIL=14 part "bench_backbone --profile, hybrid at 8 x 4096, round $round" 130 \
      python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 20 --variants hybrid \
      --profile
  done
  attnres_step 4 170 16 6
  ;;
pair16)
  PART_TAIL=6 part "KDA backward tests on the GPU" 120 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_kda_bwd.py tests/kernels/test_kda_triton.py -k "bwd or grad or training"
  bwd_sweep 8x4096x6 60 "pair parts fp32,default again" init fp32
  bwd_sweep 1x8192x32 60 "pair parts fp32,default again"
  mkdir -p "$OUT/backbone"
  OUT=$OUT/backbone PART_TAIL=40 part "bench_backbone --profile, hybrid at 8 x 4096" 130 python3 -m \
    kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --variants hybrid --profile
  ;;
nogate)
  PART_TAIL=6 part "KDA backward tests on the GPU" 100 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_kda_bwd.py tests/kernels/test_kda_triton.py -k "bwd or grad or training"
  bwd_sweep 8x4096x6 45 "default again" init fp32
  mkdir -p "$OUT/backbone"
  OUT=$OUT/backbone PART_TAIL=40 part "bench_backbone --profile, hybrid at 8 x 4096" 100 python3 -m \
    kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --variants hybrid --profile
  ;;
esac
