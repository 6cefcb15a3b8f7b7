#!/usr/bin/env bash
# Session 36's GPU calls (results: docs/results/gpu-2026-12-07-s36/):
#   bash scripts/gpu_session36.sh prep    call1 (3e77561, where one constant BWD_FUSED_PREP held both of today's
#       BWD_FUSED_L2 and BWD_FUSED_GATE): the KDA training backward with the L2 norm's and the gate's parts inside the
#       core kernels: the KDA GPU tests; ab_kda.py against both off, with fla-core in the same run, at the issue's five
#       shapes and the small hybrid's 8x4096x6; the small hybrid's profiled training step (issue 5's MFU) with them and
#       without them (a copy of the tree with the constants flipped), interleaved twice.
#   bash scripts/gpu_session36.sh split   call2: the same with the dY kernel scaling dA by the norms (the pair kernel's
#       sums then need none): the KDA GPU tests; ab_kda.py of BWD_FUSED_L2 off, BWD_FUSED_GATE off and both off against
#       the default at 1x8192x32, 2x16384x16 and the hybrid's 8x4096x6 (no fla); the small hybrid's profiled step with
#       each of the four settings. (Call2's ab_kda JSON folders were named with '=' and did not come back; their tables
#       are in its all.log.)
#   bash scripts/gpu_session36.sh final   call3: the session's last code on the issues' GPU: the KDA GPU tests; bench_kda.py
#       ours vs fla-core at the five shapes with CUDA-graph forwards (issue 4's table); the small hybrid's profiled step
#       twice (issue 5's MFU); the block-AttnRes step overhead three times (issue 6, bench_attnres, 4 rounds each).
#   bash scripts/gpu_session36.sh join    call4 (cb66540, where BWD_GATE_JOIN existed; reverted in 8dfc360): the inter
#       kernel's gate epilogue with its two partial sums from one reduction and the sigmoid from the softplus's
#       exponential: the KDA backward GPU tests; ab_kda.py of BWD_GATE_JOIN=False against it (three shapes, no fla);
#       the hybrid's profiled step with it and without it, interleaved twice.
set -u
source "$(dirname "$0")/gpu_parts.sh"

backbone_run() {  # name dir: bench_backbone --profile of the small hybrid from the code in dir, JSON in $OUT/name
  local name=$1 dir=$2
  mkdir -p "$OUT/$name"
  (cd "$dir" && OUT=$OUT/$name PYTHONPATH=$dir:/tmp/site PART_TAIL=6 part "bench_backbone --profile, $name" 120 \
    python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --variants hybrid \
    --profile --profile-top 60)
  python3 scripts/backbone_summary.py "$OUT/$name/bench_backbone.json" kda | tee -a "$LOG"
}

gpu_header
flip_to() {  # l2 gate: a copy of the tree at /tmp/flip with BWD_FUSED_L2 and BWD_FUSED_GATE set so
  flipped_tree kernels/kda/chunk_triton.py "s/^BWD_FUSED_L2 = True/BWD_FUSED_L2 = $1/" \
    kernels/kda/chunk_triton.py "s/^BWD_FUSED_GATE = True/BWD_FUSED_GATE = $2/"
}

case "${1:?usage: gpu_session36.sh prep|split|final|join}" in
prep)
  install_fla
  kda_tests 240 tests/kernels/test_kda_bwd_fused_prep.py tests/kernels/test_kda_prep.py
  PART_TAIL=14 part "ab_kda: the fused L2 and gate off against the default" 330 python3 kernels/benchmarks/ab_kda.py \
    --set BWD_FUSED_L2=False BWD_FUSED_GATE=False --rounds 2 --shapes 1x8192x32 4x4096x32 8x2048x16 2x16384x16 \
    1x32768x16 8x4096x6
  flip_to False False
  for round in a b; do
    backbone_run fused_$round "$PWD"
    backbone_run unfused_$round /tmp/flip
  done
  ;;
split)
  kda_tests 240 tests/kernels/test_kda_bwd_fused_prep.py tests/kernels/test_kda_prep.py
  for setting in BWD_FUSED_L2=False BWD_FUSED_GATE=False "BWD_FUSED_L2=False BWD_FUSED_GATE=False"; do
    name=${setting//=/_}
    name=${name// /_}
    mkdir -p "$OUT/ab_$name"
    # shellcheck disable=SC2086 # the setting's words are separate --set values
    OUT=$OUT/ab_$name PART_TAIL=8 part "ab_kda: $setting against the default" 120 python3 kernels/benchmarks/ab_kda.py \
      --set $setting --rounds 2 --no-fla --shapes 1x8192x32 2x16384x16 8x4096x6
  done
  backbone_run both "$PWD"
  for pair in "False True" "True False" "False False"; do
    # shellcheck disable=SC2086 # two words: l2 gate
    flip_to $pair
    backbone_run "l2_${pair% *}_gate_${pair#* }" /tmp/flip
  done
  ;;
final)
  install_fla
  kda_tests 240 tests/kernels/test_kda_bwd_fused_prep.py tests/kernels/test_kda_prep.py
  bench_five 330
  for round in a b; do
    backbone_run final_$round "$PWD"
  done
  for round in a b c; do
    attnres_candidate attnres_$round 12 10
  done
  ;;
join)
  PART_TAIL=6 part "KDA backward GPU tests" 150 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_kda_bwd.py tests/kernels/test_kda_bwd_fused_prep.py tests/kernels/test_kda_prep.py
  mkdir -p "$OUT/ab_join"
  OUT=$OUT/ab_join PART_TAIL=8 part "ab_kda: BWD_GATE_JOIN=False against the default" 150 python3 \
    kernels/benchmarks/ab_kda.py --set BWD_GATE_JOIN=False --rounds 3 --no-fla --shapes 1x8192x32 2x16384x16 8x4096x6
  flipped_tree kernels/kda/chunk_triton_bwd.py 's/^BWD_GATE_JOIN = True/BWD_GATE_JOIN = False/'
  for round in a b; do
    backbone_run join_$round "$PWD"
    backbone_run nojoin_$round /tmp/flip
  done
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
