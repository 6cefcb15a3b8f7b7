#!/usr/bin/env bash
# For the next session's GPU time (written in session 12, whose device time ran out), one H100 call per PART:
#   bash scripts/gpu_session13.sh absorb DATA   the AttnRes kernel and model tests on the GPU (the absorbed partial
#       sums included: KVL_ATTNRES_ABSORB), bench_attnres at batch 8 x 4096 (train section with
#       attnres_triton_absorb, --profile: the kernels that differ between adding the partial sums and absorbing
#       them), then the app (small_pretrain, batch 16, 24 steps) with KVL_ATTNRES_ABSORB off / on, interleaved twice
#   bash scripts/gpu_session13.sh gaps DATA     issue 9: where the GPU waits in the app's own loop at batch 24
#       (profile_train_step --pipeline-steps: kernels.profiling.idle_gaps, the holes between kernels by host op)
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

gpu_header
case "${1:?usage: gpu_session13.sh absorb|gaps DATA}" in
absorb)
  DATA=${2:?usage: gpu_session13.sh absorb DATA}
  PART_TAIL=8 part "gpu tests: AttnRes kernels and model" 170 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py
  PART_TAIL=40 part "bench_attnres train + profile" 230 python3 -m kimi_vl.benchmarks.bench_attnres \
    --sources 4 --rounds 3 --hybrid-iters 3 --profile --decode-steps 0 --budget-s 150
  APP_OVERRIDES="data.batch_size=16" app_ab add KVL_ATTNRES_ABSORB=0 absorb KVL_ATTNRES_ABSORB=1
  ;;
gaps)
  DATA=${2:?usage: gpu_session13.sh gaps DATA}
  PART_TAIL=40 part "pipeline gaps, batch 24" 280 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=24 data.num_workers=8 \
    --steps 1 --warmup 6 --module-steps 0 --pipeline-steps 6 --out "$OUT/gaps_b24"
  ;;
esac
ls -la "$OUT"
