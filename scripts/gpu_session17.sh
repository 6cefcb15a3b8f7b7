#!/usr/bin/env bash
# Session 17's GPU parts, one H100 call per PART (results: docs/results/gpu-2026-11-28-s17/):
#   bash scripts/gpu_session17.sh decode   block AttnRes decode: the two-phase GPU tests; bench_two_phase (phase 2 by
#       warps, rows per program and norm statistics); graph decode with phase 2's exact norm statistics (the default)
#       and with expanded ones (one reduction); then session 16's pending checks (cross-entropy and sm90-compile tests
#       on the GPU machine, the apps' decode bench; lm_eval, dill, chardet, defusedxml, truststore wheels in .whl)
#       (call1)
#   bash scripts/gpu_session17.sh decode2  the same GPU tests, bench_two_phase at one token and graph decode (exact and
#       expanded statistics) after the norm gain's load moved to the kernels' start and phase 1 loads its query's
#       addresses first (bench_two_phase also times phase 1 with and without the joint sums); the sm90-compile test
#       with the PTX version declared for the GPU machine's ptxas (call2)
#   bash scripts/gpu_session17.sh decode3  after phase 2's expanded statistics and the joint-sums switch were removed
#       (no consistent gain in calls 1-2) and the standard's norm kernels got the same two changes (one row a program
#       for few rows, the gain loaded first): the two-phase and norm GPU tests, bench_two_phase at one token, graph
#       decode (call3)
#   bash scripts/gpu_session17.sh kda      the KDA training path with its gate inside the prep and inter kernels
#       (TRAIN_FUSED_GATE): the KDA GPU tests, then kernels/benchmarks/ab_kda.py against the gate kernel first, with
#       fla-core (carried wheel) in the same run (call4, at 99dbfb7; slower fwd+bwd, reverted: the part now fails on
#       the missing constant)
#   bash scripts/gpu_session17.sh wu       the KDA forward with W / U in a kernel of their own (WU_SEPARATE) against the
#       fused scores kernel: its GPU test, then sweep_kda_fwd.py's wu settings at 1 x 8192 x 32 with fla in the run
#       (call5, at fd13f30; slower, reverted: the part's settings are gone)
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false
GRAPH_DECODE=(--decode-only --graph-decode --decode-steps 48 --rounds 2 --graph-rounds 12 --sources 2 --profile
  --profile-top 8)

graph_decode_with() {  # PHASE2_NORM_STATS value, then bench_attnres arguments
  local stats=$1
  shift
  python3 -c "import runpy, sys
import kernels.attn_res.two_phase_triton as tp
tp.PHASE2_NORM_STATS = sys.argv[1]
sys.argv = ['bench_attnres'] + sys.argv[2:]
runpy.run_module('kimi_vl.benchmarks.bench_attnres', run_name='__main__')" "$stats" "$@"
}

gpu_header
case "${1:?usage: gpu_session17.sh decode|decode2|decode3|kda|wu}" in
wu)
  install_fla
  PART_TAIL=8 part "KDA GPU tests (W / U kernel, forward intermediates)" 90 python3 -m pytest -q -p no:cacheprovider \
    -rf tests/kernels/test_kda_triton.py -k "wu_kernel or fwd_intermediates"
  PART_TAIL=30 part "sweep_kda_fwd: W / U kernel" 300 python3 kernels/benchmarks/sweep_kda_fwd.py --shape 1x8192x32 \
    --only "wu separate,wu separate w8,wu separate w8 s1"
  ;;
kda)
  install_fla
  PART_TAIL=12 part "KDA GPU tests (training path, gate)" 170 python3 -m pytest -q -p no:cacheprovider -rf \
    tests/kernels/test_kda_bwd.py tests/kernels/test_kda_triton.py tests/kernels/test_kda_prep.py \
    -k "${TEST_FILTER:-gpu_bf16 or gate or varlen or wired}"
  PART_TAIL=30 part "ab_kda: gate in the kernels (default) against the gate kernel" 330 python3 \
    kernels/benchmarks/ab_kda.py --set TRAIN_FUSED_GATE=False --shapes 1x8192x32 4x4096x32 --rounds 3
  ;;
decode3)
  PART_TAIL=8 part "GPU tests: two-phase kernels and streams, norms" 150 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py tests/model/test_static_decode.py \
    tests/kernels/test_norm.py -k "two_phase or buffered or fused or graph or launcher or live or norm"
  PART_TAIL=50 part "bench_two_phase" 150 python3 kernels/benchmarks/bench_two_phase.py --tokens 1
  PART_TAIL=14 part "bench_attnres graph decode" 150 python3 -m kimi_vl.benchmarks.bench_attnres "${GRAPH_DECODE[@]}"
  ;;
decode|decode2)
  PART_TAIL=8 part "GPU tests: two-phase kernels and streams" 150 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py tests/model/test_static_decode.py \
    -k "${TEST_FILTER:-two_phase or buffered or fused or graph or launcher or expanded or live}"
  PART_TAIL=70 part "bench_two_phase" 150 python3 kernels/benchmarks/bench_two_phase.py --tokens 1 \
    $([ "$1" = decode ] && echo 8)
  for stats in exact expanded; do
    mkdir -p "$OUT/$stats"
    PART_TAIL=14 part "bench_attnres graph decode, phase 2 norm statistics: $stats" 150 env OUT="$OUT/$stats" \
      bash -c "$(declare -f graph_decode_with); graph_decode_with $stats ${GRAPH_DECODE[*]}"
  done
  if [ "$1" = decode2 ]; then
    PART_TAIL=20 part "sm90-compile test on the GPU machine" 90 python3 -m pytest -q -p no:cacheprovider \
      tests/kernels/test_attnres_compiles.py -rf
    ls -la "$OUT"
    exit 0
  fi
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/lm_eval*.whl .whl/dill*.whl \
    .whl/chardet*.whl .whl/defusedxml*.whl .whl/truststore*.whl 2>&1 | tail -2
  PART_TAIL=40 part "cross-entropy and sm90-compile tests on the GPU" 100 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_cross_entropy.py tests/kernels/test_attnres_compiles.py -rf
  PART_TAIL=30 part "eval.bench_decode (demo, lm-eval)" 150 python3 -m eval.bench_decode
  ;;
esac
ls -la "$OUT"
