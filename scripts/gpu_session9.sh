#!/usr/bin/env bash
# Session 9's GPU checks, one H100 call per PART (run from the repo root on the GPU machine):
#   bash scripts/gpu_session9.sh params DATA   the app with precision=bf16 (fp32 weights under autocast) against
#                                              precision=bf16_params (bf16 weight copies, kimi_vl/train/param_cast.py),
#                                              24 steps each, A B A B; per-step time ratios on the same batches and
#                                              the losses; a steady-state profile of bf16_params (torch profiler)
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

gpu_header
case "${1:?usage: gpu_session9.sh params|params2 DATA}" in
params)
  DATA=${2:?usage: gpu_session9.sh params DATA}
  export APP_STEPS=24
  APP_OVERRIDES=precision=bf16 app16 bf16_a KVL_NOTHING=1
  APP_OVERRIDES=precision=bf16_params app16 params_a KVL_NOTHING=1
  APP_OVERRIDES=precision=bf16 app16 bf16_b KVL_NOTHING=1
  APP_OVERRIDES=precision=bf16_params app16 params_b KVL_NOTHING=1
  app_compare bf16_a params_a
  app_compare bf16_b params_b
  app_compare bf16_a bf16_b
  PART_TAIL=60 part "profile app bf16_params" 200 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=8 data.num_workers=8 \
    precision=bf16_params --steps 3 --warmup 6 --module-steps 0 --torch-profile --out "$OUT/app_params"
  ;;
params2)
  DATA=${2:?usage: gpu_session9.sh params2 DATA}
  PART_TAIL=30 part host_costs_ops 120 python3 kernels/benchmarks/host_costs.py --ops --out "$OUT/host_costs_ops.json"
  export APP_STEPS=24
  APP_OVERRIDES="precision=bf16 gc_every=0" app16 bf16_gc0 KVL_NOTHING=1
  APP_OVERRIDES="precision=bf16_params gc_every=0" app16 params_gc0 KVL_NOTHING=1
  APP_OVERRIDES="precision=bf16_params gc_every=8" app16 params_gc8 KVL_NOTHING=1
  APP_OVERRIDES="precision=bf16 gc_every=0" app16 bf16_gc0_b KVL_NOTHING=1
  APP_OVERRIDES="precision=bf16_params gc_every=8" app16 params_gc8_b KVL_NOTHING=1
  app_compare bf16_gc0 params_gc0
  app_compare bf16_gc0_b params_gc8_b
  app_compare params_gc0 params_gc8
  grep -h gc_s "$OUT"/app24_params_gc8*_metrics.jsonl | python3 -c "import json, sys; \
print('gc_s per collection:', [round(json.loads(l)['gc_s'], 3) for l in sys.stdin])" | tee -a "$LOG"
  PART_TAIL=60 part "profile app bf16_params" 200 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=8 data.num_workers=8 \
    precision=bf16_params --steps 3 --warmup 6 --module-steps 0 --torch-profile --out "$OUT/app_params"
  ;;
esac
ls -la "$OUT"
