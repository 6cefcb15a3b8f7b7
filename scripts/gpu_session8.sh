#!/usr/bin/env bash
# Session 8's GPU checks, one H100 call per PART (run from the repo root on the GPU machine):
#   bash scripts/gpu_session8.sh probe DATA   host cost per call of GEMMs (fixed vs changing row count), Triton
#                                             launches; the app's 16-step run with and without OMP_NUM_THREADS=1
#                                             (A, B, A again: the spread of A against A is the call's noise)
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

app16() {  # name, then extra env assignments and key=value overrides
  local name=$1
  shift
  part "app16 $name" 150 env "$@" python3 -m kimi_vl.train --config kimi_vl/configs/small_pretrain.yaml \
    output_dir=/tmp/runs/app16_$name max_steps=16 data.path="$DATA" data.num_workers=8 eval_every=1000 \
    checkpoint_every=1000 optim.warmup_steps=2 optim.total_steps=16 ${APP_OVERRIDES:-}
  cp /tmp/runs/app16_$name/metrics.jsonl "$OUT/app16_${name}_metrics.jsonl" 2>/dev/null
  python3 -c "import json, statistics as s; r=[json.loads(l) for l in open('$OUT/app16_${name}_metrics.jsonl')]; \
t=[x['tokens_per_s'] for x in r if 6 <= x['step'] <= 16]; print('app16 $name median steps 6-16:', round(s.median(t)), \
'tokens/s, range', round(min(t)), '-', round(max(t)))" 2>&1 | tee -a "$LOG"
}

gpu_header
case "${1:?usage: gpu_session8.sh probe DATA}" in
probe)
  DATA=${2:?usage: gpu_session8.sh probe DATA}
  PART_TAIL=30 part host_costs 90 python3 kernels/benchmarks/host_costs.py --out "$OUT/host_costs.json"
  app16 base_a KVL_NOTHING=1
  app16 omp1 OMP_NUM_THREADS=1
  app16 base_b KVL_NOTHING=1
  ;;
esac
ls -la "$OUT"
