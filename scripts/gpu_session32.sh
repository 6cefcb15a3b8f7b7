#!/usr/bin/env bash
# Session 32's GPU calls (results: docs/results/gpu-<date>-s32/):
#   bash scripts/gpu_session32.sh norm   call1: the block-AttnRes training mixes apply their sublayer's input RMSNorm
#       in the forward kernel (mix_triton.FWD_NORM, mix_autograd.AttnResMixNormTriton: y written beside h, the norm's
#       own forward launch gone): the AttnRes GPU tests (kernels and the model's), and the small hybrid's block-AttnRes
#       step profiled with it and with --set FWD_NORM=False, interleaved twice, 4 rounds each (ran at c80538b; since
#       the change's revert in 4540eb5 the constant is gone and bench_attnres stops at --set: kept as it ran).
#   bash scripts/gpu_session32.sh graph  call2: a training step replayed as one CUDA graph
#       (kimi_vl.train.graphed_step.GraphedTrainStep): its GPU test (replays equal eager steps), and bench_backbone's
#       hybrid and block-AttnRes hybrid at 8 x 4096, eager and graph-replayed, twice (ran at de00fbe; reverted after
#       it, so this mode no longer runs: kept as it ran).
#   bash scripts/gpu_session32.sh normbwd call3: the RMSNorm backward in the row layout (kernels/norm/norm_triton.py
#       _norm_bwd_rows_kernel: a row's sum is a warp shuffle; 149-165 registers against the tile kernel's 253-255 and
#       its 40-byte spill with the stream's gradient, ptxas sm_90a): the norm GPU tests and the whole-model
#       Triton-vs-PyTorch test, bench_norm --bwd-sweep (the kernel alone under launch settings), and bench_backbone
#       --profile of the hybrid and block-AttnRes hybrid with it and with the tile kernel (a copy of the tree with
#       NORM_BWD_ROWS = False), interleaved twice (ran at a4eaa81, where every row of at most 8 chunks took the row
#       kernel).
#   bash scripts/gpu_session32.sh normbwd2 call4: the same with only one-chunk rows on the row kernel (the KDA output's
#       gated norm; NORM_ROWS_MAX_CHUNKS = 1, 4 elements a thread): the norm GPU tests, bench_norm --bwd-sweep, and
#       bench_backbone --profile of the hybrid with it and with the tile kernel, interleaved twice.
#   bash scripts/gpu_session32.sh normsweep call5: bench_norm --bwd-sweep with the tile kernel's own launch settings
#       (NORM_BWD_TILE_ELEMS, NORM_BWD_WARPS, NORM_BWD_TILES) beside the row kernel's.
#   bash scripts/gpu_session32.sh pairsweep call6: sweep_kda_bwd.py at the small hybrid's shape, gates and fp32 beta
#       (8x4096x6, init gates) over the pair kernel's warps, stages and key-block width (swept before at other shapes).
#   bash scripts/gpu_session32.sh pairbk call7: the pair kernel at 64 key channels and 2 warps (call6's best at the
#       model's shape) with each unroll, at 8x4096x6 (init gates, fp32 beta) and 1x8192x32 (fp32 and bf16 beta), and
#       bench_backbone --profile of the hybrid with the default and with it (a copy of the tree with BWD_PAIR_BK = 64
#       and the pair launch at 2 warps; ran at d9f7454: since 69b1bfe that is the default and the copy is the same).
#   bash scripts/gpu_session32.sh final call8: with the pair kernel at 64 key channels, 2 warps, unroll 1 (the new
#       defaults): the KDA GPU tests, the five shapes against fla-core 0.6.0 (bench_kda --graph), and bench_backbone
#       of the small hybrid at 8 x 4096.
set -u
source "$(dirname "$0")/gpu_parts.sh"

norm_ab() {  # variants...: bench_backbone --profile at 8 x 4096 in this tree (rows) and /tmp/flip (tile), twice
  for round in a b; do
    for tree in rows tile; do
      dir=$PWD; [ "$tree" = tile ] && dir=/tmp/flip
      mkdir -p "$OUT/${tree}_$round"
      (cd "$dir" && OUT=$OUT/${tree}_$round PART_TAIL=14 part "bench_backbone --profile, $tree norm backward, $round" \
        150 env PYTHONPATH="$dir:/tmp/site" python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 \
        --decode-contexts --iters 10 --profile --variants "$@")
    done
  done
}

gpu_header
case "${1:?usage: gpu_session32.sh norm|graph|normbwd|normbwd2|normsweep|pairsweep|pairbk|final}" in
norm)
  PART_TAIL=6 part "AttnRes kernel and model tests on the GPU" 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/kernels/test_attnres_compiles.py tests/model/test_attn_res.py
  for round in a b; do
    attnres_candidate "norm_$round" 12 8
    attnres_candidate "sep_$round" 12 8 --set FWD_NORM=False
  done
  ;;
graph)
  PART_TAIL=6 part "graphed training step tests on the GPU" 150 python3 -m pytest -q -p no:cacheprovider -rf \
    tests/train/test_graphed_step.py
  for round in a b; do
    mkdir -p "$OUT/backbone_$round"
    OUT=$OUT/backbone_$round PART_TAIL=12 part "bench_backbone eager and CUDA graph, round $round" 200 python3 -m \
      kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --variants hybrid \
      hybrid_attnres --graph-train
  done
  ;;
normbwd)
  PART_TAIL=6 part "norm tests on the GPU" 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_norm.py tests/model/test_backbone_invariants.py tests/model/test_attn_res.py
  PART_TAIL=8 part "bench_norm --bwd-sweep" 150 python3 kernels/benchmarks/bench_norm.py --bwd-sweep \
    --out "$OUT/bench_norm_bwd.json"
  flipped_tree kernels/norm/norm_triton.py 's/^NORM_BWD_ROWS = True/NORM_BWD_ROWS = False/'
  norm_ab hybrid hybrid_attnres
  ;;
normbwd2)
  PART_TAIL=6 part "norm tests on the GPU" 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_norm.py tests/model/test_backbone_invariants.py
  PART_TAIL=8 part "bench_norm --bwd-sweep" 150 python3 kernels/benchmarks/bench_norm.py --bwd-sweep \
    --out "$OUT/bench_norm_bwd.json"
  flipped_tree kernels/norm/norm_triton.py 's/^NORM_BWD_ROWS = True/NORM_BWD_ROWS = False/'
  norm_ab hybrid
  ;;
normsweep)
  PART_TAIL=8 part "bench_norm --bwd-sweep" 150 python3 kernels/benchmarks/bench_norm.py --bwd-sweep \
    --out "$OUT/bench_norm_bwd.json"
  ;;
pairsweep)
  bwd_sweep 8x4096x6 200 "pair w2,pair w8,pair w4 s2,pair w2 bk64,pair w4 bk64,pair w2 bk16,default again" init fp32
  ;;
pairbk)
  bwd_sweep 8x4096x6 150 "pair w2 bk64,pair w2 bk64 unroll 1,pair w2 bk64 unroll 4,pair w1 bk64,default again" init fp32
  bwd_sweep 1x8192x32 120 "pair w2 bk64,pair w2 bk64 unroll 1,default again" "" fp32
  bwd_sweep 1x8192x32 90 "pair w2 bk64,default again"
  flipped_tree kernels/kda/chunk_triton_bwd.py 's/^BWD_PAIR_BK = 32 /BWD_PAIR_BK = 64 /' \
    kernels/kda/chunk_triton_bwd.py 's/pair=(4, 1)/pair=(2, 1)/'
  for tree in default bk64; do
    dir=$PWD; [ "$tree" = bk64 ] && dir=/tmp/flip
    mkdir -p "$OUT/$tree"
    (cd "$dir" && OUT=$OUT/$tree PART_TAIL=3 part "bench_backbone --profile, pair kernel $tree" 120 \
      env PYTHONPATH="$dir:/tmp/site" python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 \
      --decode-contexts --iters 10 --profile --variants hybrid)
  done
  ;;
final)
  install_fla
  kda_tests 130 tests/kernels/test_kda_prep.py
  bench_five 100
  mkdir -p "$OUT/backbone"
  OUT=$OUT/backbone PART_TAIL=8 part "bench_backbone, the small hybrid" 70 python3 -m kimi_vl.benchmarks.bench_backbone \
    --train-seqs 4096 --decode-contexts --iters 10 --variants hybrid
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
