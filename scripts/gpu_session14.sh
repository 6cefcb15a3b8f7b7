#!/usr/bin/env bash
# Session 14's GPU parts, one H100 call per PART (results: docs/results/gpu-2026-11-27-s14/):
#   bash scripts/gpu_session14.sh ab DATA OLD   issue 9: GPU tests of this session's changes, then the app at batch 24
#       for 64 steps, the code in OLD (a folder: the commit before) and this one interleaved (OLD, new, OLD, new), the
#       per-step time ratio of the same batches and the median mfu of steps 33-64 of each run
#       (call1: OLD = ad8e601, new = 8cba7dd; call2: OLD = 8cba7dd, new = the fused vision LayerNorm, with TESTS set)
#   bash scripts/gpu_session14.sh confirm DATA  the norm / tower tests on the GPU, bench_backbone (hybrid, block AttnRes,
#       all-MLA at 4096 and 32768, same run), then the app at batch 24 for 64 steps (mfu of steps 33-64)
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

mfu64() {  # run name: median tokens/s and mfu of steps 33-64, peak memory
  python3 -c "import json, statistics as s; r=[json.loads(l) for l in open('$OUT/app64_$1_metrics.jsonl')]; \
t=[x for x in r if x['step'] > 32]; print('app64 $1 steps 33-64: median', round(s.median(x['tokens_per_s'] for x in t)), \
'tokens/s, mfu', round(s.median(x['mfu'] for x in t), 4), ', peak', round(max(x['peak_mem_gib'] for x in t), 1), 'GiB')" \
  2>&1 | tee -a "$LOG"
}

gpu_header
case "${1:?usage: gpu_session14.sh ab DATA OLD}" in
ab)
  DATA=${2:?usage: gpu_session14.sh ab DATA OLD}
  OLD=${3:?usage: gpu_session14.sh ab DATA OLD}
  # TESTS: the test files to run first (default: call1's; call2 added the LayerNorm and encoder tests)
  PART_TAIL=8 part "GPU tests of the changes" 150 python3 -m pytest -q -n 8 -p no:cacheprovider ${TESTS:-\
    tests/kernels/test_linear.py tests/kernels/test_kda_prep.py tests/model/test_kda_layer_backends.py \
    tests/kernels/test_kda_triton.py tests/kernels/test_short_conv_triton.py}
  export APP_STEPS=64 APP_OVERRIDES="data.batch_size=24"
  for round in a b; do
    APP_DIR=$OLD app16 "old_$round"
    app16 "new_$round"
  done
  APP_STEPS=64 app_compare old_a new_a
  APP_STEPS=64 app_compare old_b new_b
  for n in old_a new_a old_b new_b; do mfu64 $n; done
  ;;
confirm)
  DATA=${2:?usage: gpu_session14.sh confirm DATA}
  PART_TAIL=8 part "GPU tests: norms, tower" 120 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/kernels/test_norm.py tests/vision/test_encoder.py
  PART_TAIL=30 part "bench_backbone" 240 python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 32768 \
    --decode-contexts --iters 5 --variants hybrid hybrid_attnres full_attn
  APP_STEPS=64 APP_OVERRIDES="data.batch_size=24" app16 final
  mfu64 final
  ;;
esac
ls -la "$OUT"
