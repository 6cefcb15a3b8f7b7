#!/usr/bin/env bash
# Session 26's GPU calls (results: docs/results/gpu-<date>-s26/), prepared at the end of session 25:
#   bash scripts/gpu_session26.sh first   call1: the pair kernel one program a chunk (BWD_PAIR_PER_CHUNK, prepared in
#       session 25, interpreter-tested only) against the default at the issue's 1x8192x32 and at the small hybrid's
#       shape and gates (8x4096x6, --gates init); ours against fla at that shape and gates; the KDA GPU tests in a
#       copy with BWD_PAIR_PER_CHUNK on; the small hybrid's step profile with it on.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session26.sh first}" in
first)
  install_fla
  settings="pair per chunk,pair per chunk w8,pair per chunk s2,pair unroll 1,default again"
  bwd_sweep 1x8192x32 110 "$settings"
  bwd_sweep 8x4096x6 110 "$settings" init
  PART_TAIL=12 part "bench_kda ours vs fla at 8x4096x6, --gates init" 60 python3 kernels/benchmarks/bench_kda.py \
    --no-prelude --graph --impls ours,fla --gates init --shapes 8x4096x6 --out "$OUT/bench_kda_8x4096x6_init.json"
  flipped_tree kernels/kda/chunk_triton_bwd.py 's/^BWD_PAIR_PER_CHUNK = False/BWD_PAIR_PER_CHUNK = True/'
  (cd /tmp/flip && PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} kda_tests 140)
  (cd /tmp/flip && OUT=$OUT/per_chunk PYTHONPATH=/tmp/flip:${PYTHONPATH#"$PWD"} backbone_profile 70)
  ;;
esac
ls -la "$OUT"
