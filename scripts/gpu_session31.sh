#!/usr/bin/env bash
# Session 31's GPU calls (results: docs/results/gpu-<date>-s31/):
#   bash scripts/gpu_session31.sh pipe   call1: the AttnRes mix kernels' loops over token tiles software-pipelined
#       (tl.range num_stages: the next tile's loads go to shared memory by cp.async while the current one is computed;
#       FWD_/BWD_/FLUSH_STAGES, the forward and flush as grid-stride loops): the GPU tests, the --bwd-sweep of the
#       pipelined configurations at N = 3 and 5, and the small hybrid's block-AttnRes step profiled under the default
#       and all three kernels pipelined (bench_attnres --set), 4 rounds each.
#   bash scripts/gpu_session31.sh stages call2: the backward alone pipelined (BWD_STAGES = 2, now the default; the
#       forward and flush loops removed after call1): the GPU tests, and the small hybrid's block-AttnRes step profiled
#       with 2 and 1 stages, interleaved twice (bench_attnres --set BWD_STAGES=1), 4 rounds each.
#   bash scripts/gpu_session31.sh launch call3: every Triton launch of the kernels through kernels.fast_launch.fast (the
#       compiled kernel called directly after a specialisation's first JIT launch, its key built from the arguments):
#       the GPU kernel tests, the step timeline of standard and block AttnRes with it and with KVL_FAST_LAUNCH=0 (host
#       and GPU time of forward and backward, plain and device-bound steps), bench_backbone both ways, interleaved.
#   bash scripts/gpu_session31.sh gputests call4: after reverting call3's launcher, the GPU tests that failed in call3
#       (rope2d, the qk_max interpreter test) on this tree, with their errors, and the AttnRes kernel tests.
#   bash scripts/gpu_session31.sh span  call6: the KDA scores kernel deciding once per (chunk, head) whether every K tile
#       takes the fast diagonal path (SCORES2_CHUNK_SPAN, with the gate in the kernel): the KDA GPU tests, ab_kda.py
#       against the per-tile check at two shapes, and the five shapes against fla (bench_kda --graph).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session31.sh pipe|stages|launch|gputests|span}" in
pipe)
  PART_TAIL=6 part "AttnRes kernel tests on the GPU" 150 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/kernels/test_attnres_compiles.py
  mkdir -p "$OUT/sweep"
  OUT=$OUT/sweep PART_TAIL=40 part "bench_attnres --bwd-sweep, pipelined configurations" 150 \
    python3 -m kimi_vl.benchmarks.bench_attnres --sources 3 5 --bwd-sweep --sweep-match STAGES --layouts --mix-iters 20
  attnres_candidate default 22 12
  attnres_candidate pipe 22 12 --set BWD_STAGES=2 --set FWD_STAGES=2 --set FWD_PROGRAMS_PER_SM=4 \
    --set FLUSH_STAGES=2 --set FLUSH_PROGRAMS_PER_SM=2
  ;;
stages)
  PART_TAIL=6 part "AttnRes kernel tests on the GPU" 150 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/kernels/test_attnres_compiles.py
  for round in a b; do
    attnres_candidate "s2_$round" 12 6
    attnres_candidate "s1_$round" 12 6 --set BWD_STAGES=1
  done
  ;;
launch)
  PART_TAIL=8 part "kernel tests on the GPU" 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_fast_launch.py tests/kernels/test_norm.py tests/kernels/test_short_conv_triton.py \
    tests/kernels/test_kda_prep.py tests/kernels/test_kda_bwd.py tests/kernels/test_kda_triton.py \
    tests/kernels/test_attn_res_triton.py tests/kernels/test_colsum.py tests/kernels/test_cross_entropy.py \
    tests/kernels/test_mla_expand.py tests/kernels/test_rope2d.py tests/optim/test_fused.py tests/optim/test_qk_max_triton.py
  PART_TAIL=10 part "step timeline, fast launches and the JIT, 8 x 4096" 200 python3 -m kimi_vl.benchmarks.step_timeline \
    --rounds 4 --steps 4 --head-start-ms 300 --variants standard standard:KVL_FAST_LAUNCH=0 attnres_block \
    attnres_block:KVL_FAST_LAUNCH=0
  for cand in fast_a jit_a fast_b jit_b; do
    flag=1; [ "${cand%_*}" = jit ] && flag=0
    mkdir -p "$OUT/$cand"
    OUT=$OUT/$cand PART_TAIL=4 part "bench_backbone, $cand" 100 env KVL_FAST_LAUNCH=$flag python3 -m \
      kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --variants hybrid
  done
  ;;
gputests)
  PART_TAIL=120 part "rope2d and qk_max tests on the GPU" 200 python3 -m pytest -q -n 4 -p no:cacheprovider -rf \
    --tb=short tests/kernels/test_rope2d.py tests/optim/test_qk_max_triton.py
  PART_TAIL=4 part "AttnRes kernel tests on the GPU" 150 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/kernels/test_attnres_compiles.py
  ;;
span)
  install_fla
  PART_TAIL=8 part "KDA GPU tests" 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_kda_triton.py tests/kernels/test_kda_prep.py tests/kernels/test_kda_bwd.py
  PART_TAIL=40 part "ab_kda: the per-tile span check only" 150 python3 kernels/benchmarks/ab_kda.py \
    --set SCORES2_CHUNK_SPAN=False --shapes 1x8192x32 1x32768x16 --rounds 3
  bench_five 170
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
