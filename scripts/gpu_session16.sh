#!/usr/bin/env bash
# Session 16's GPU parts, one H100 call per PART (results: docs/results/gpu-2026-11-27-s16/):
#   bash scripts/gpu_session16.sh decode   session 15's prepared `pending` part: the fused-norm GPU tests, the
#       graph-decode overhead of block AttnRes with the input norms inside the two-phase kernels (bench_attnres's
#       attnres_block_fused_norm variant), and hybrid vs all-MLA decode at 128K context and batch 16 (call1)
#   bash scripts/gpu_session16.sh fused    the fused add + RMSNorm of the standard residual (KVL_FUSED_NORM): its GPU
#       tests, bench_attnres's graph decode of both residuals with and without the fused norms, then the demo's and
#       lm-eval's decode paths against generate (`python -m eval.bench_decode`; lm_eval, dill, chardet, defusedxml,
#       truststore carried as wheels in .whl) (call2)
#   bash scripts/gpu_session16.sh qpar     decode phase 1 with one program per (token, query) over a running-sum slot
#       of its own: the two-phase GPU tests, bench_two_phase (layouts, warps, phase 2 with the norm), graph decode
#       (call3; call4: the queries' u formed in the kernels from the parameters' addresses, phase 2 at 8 warps;
#       call5: phase 2 takes its query's w and gain as pointer arguments; call7 (d790058): phase 2's norm statistics
#       from expanded sums, slower (2.78 against 2.57 us a launch; hybrid +5.2% against call5's +4.4%) and removed)
#   bash scripts/gpu_session16.sh final    bench_backbone's decode at 32K / 128K context, batch 1 and 16, hybrid vs
#       all-MLA (graph-replayed and eager); then the kernel tests on the GPU machine (which of them assume a CPU),
#       under a time limit (call6)
#   bash scripts/gpu_session16.sh ktests   the kernel tests on the GPU machine again, cross entropy first (call8)
#   bash scripts/gpu_session16.sh pending  prepared for the next session, not run in session 16: the cross-entropy
#       and sm90-compile tests on the GPU machine (fixed / failing in call8), the apps' decode bench after the
#       tail-only stop-string check and GraphDecoder's preallocated output (lm_eval etc. wheels in .whl)
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

gpu_header
case "${1:?usage: gpu_session16.sh decode|fused|qpar|final|ktests|pending}" in
decode)
  PART_TAIL=8 part "GPU tests: graph decode, fused norm" 120 python3 -m pytest -q -p no:cacheprovider \
    tests/model/test_static_decode.py tests/model/test_attn_res.py tests/kernels/test_attn_res_triton.py \
    -k "${TEST_FILTER:-graph or fused}"
  PART_TAIL=30 part "bench_attnres decode (graph, fused norm)" 170 python3 -m kimi_vl.benchmarks.bench_attnres \
    --decode-only --graph-decode --decode-steps 48 --rounds 2 --graph-rounds 12 --sources 2 --profile --profile-top 10
  PART_TAIL=30 part "bench_backbone decode, batch 16" 280 python3 -m kimi_vl.benchmarks.bench_backbone \
    --train-seqs --decode-contexts 131072 --decode-batch 16 --decode-steps 16 --graph-decode --variants hybrid \
    full_attn
  ;;
fused)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/lm_eval*.whl .whl/dill*.whl \
    .whl/chardet*.whl .whl/defusedxml*.whl .whl/truststore*.whl 2>&1 | tail -2
  PART_TAIL=8 part "GPU tests: fused add + norm, graph decode, decoder slot" 150 python3 -m pytest -q \
    -p no:cacheprovider tests/kernels/test_norm.py tests/model/test_attn_res.py tests/model/test_static_decode.py \
    tests/model/test_decode_ops.py -k "${TEST_FILTER:-add_rms or standard_stream or fused or graph or slot}"
  PART_TAIL=40 part "bench_attnres decode (graph, fused and separate norms)" 200 python3 -m \
    kimi_vl.benchmarks.bench_attnres --decode-only --graph-decode --decode-steps 48 --rounds 2 --graph-rounds 12 \
    --sources 2 --profile --profile-top 8
  PART_TAIL=30 part "eval.bench_decode (demo, lm-eval)" 200 python3 -m eval.bench_decode
  ;;
qpar)
  PART_TAIL=8 part "GPU tests: two-phase kernels and streams" 150 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py tests/model/test_static_decode.py \
    -k "${TEST_FILTER:-two_phase or buffered or fused or graph or launcher}"
  PART_TAIL=50 part "bench_two_phase" 120 python3 kernels/benchmarks/bench_two_phase.py --tokens 1 8
  PART_TAIL=14 part "bench_attnres decode (graph, fused and separate norms)" 200 python3 -m \
    kimi_vl.benchmarks.bench_attnres --decode-only --graph-decode --decode-steps 48 --rounds 2 --graph-rounds 12 \
    --sources 2 --profile --profile-top 8
  ;;
final)
  for batch in 16 1; do
    OUT_JSON=$OUT/b$batch; mkdir -p "$OUT_JSON"
    PART_TAIL=14 part "bench_backbone decode, batch $batch" 200 env OUT="$OUT_JSON" python3 -m \
      kimi_vl.benchmarks.bench_backbone --train-seqs --decode-contexts 32768 131072 --decode-batch $batch \
      --decode-steps 16 --graph-decode --variants hybrid full_attn
  done
  PART_TAIL=60 part "kernel tests on the GPU machine" 240 python3 -m pytest -q -p no:cacheprovider --timeout 60 \
    tests/kernels -m "not slow" -rf
  ;;
ktests)
  PART_TAIL=20 part "cross-entropy tests on the GPU" 120 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_cross_entropy.py -rf
  PART_TAIL=40 part "the other kernel tests on the GPU" 330 python3 -m pytest -q -p no:cacheprovider --timeout 60 \
    tests/kernels -m "not slow" -rf --deselect tests/kernels/test_attnres_compiles.py \
    --ignore tests/kernels/test_cross_entropy.py --ignore tests/kernels/test_attn_res_triton.py
  ;;
pending)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/lm_eval*.whl .whl/dill*.whl \
    .whl/chardet*.whl .whl/defusedxml*.whl .whl/truststore*.whl 2>&1 | tail -2
  PART_TAIL=40 part "cross-entropy and sm90-compile tests on the GPU" 200 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_cross_entropy.py tests/kernels/test_attnres_compiles.py -rf
  PART_TAIL=30 part "eval.bench_decode (demo, lm-eval)" 200 python3 -m eval.bench_decode
  ;;
esac
ls -la "$OUT"
