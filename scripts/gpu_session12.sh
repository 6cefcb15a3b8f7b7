#!/usr/bin/env bash
# Session 12's GPU checks, one H100 call per PART (run from the repo root on the GPU machine):
#   bash scripts/gpu_session12.sh defer DATA   the AttnRes kernel and model tests on the GPU (the deferred block
#       gradients included), then bench_attnres at batch 8 x 4096 (N = 4 mix, train section with
#       attnres_triton_defer, --profile: the kernels that differ between per-mix and deferred gradients), then the
#       app (small_pretrain, batch 16, 24 steps) with KVL_ATTNRES_DEFER_GRAD off / on, interleaved twice
#   bash scripts/gpu_session12.sh final DATA   the AttnRes model tests (deferred gradients on by default now), the
#       residual stream's host cost per decoded token (standard vs two-phase AttnRes, and one launch of each) with
#       decode of the hybrid at 4096 (5 rounds), then the app at batch 24 (rows forward + deferred gradients) for
#       issue 9's number
#   bash scripts/gpu_session12.sh launch       the two-phase GPU tests (TwoPhaseLauncher calling its compiled kernels
#       directly), then the stream cost (one phase-2 launch direct vs through the JIT) and decode at 4096
#   bash scripts/gpu_session12.sh profile DATA  the app's step at batch 24 (its best mfu) under profile_train_step:
#       phases, GPU kernels (--torch-profile), host time per function (--host-profile), the unsynchronised loop
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

gpu_header
case "${1:?usage: gpu_session12.sh defer|final|profile DATA | launch}" in
defer)
  DATA=${2:?usage: gpu_session12.sh defer DATA}
  PART_TAIL=8 part "gpu tests: AttnRes kernels and model" 170 python3 -m pytest -q -x -p no:cacheprovider \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py
  PART_TAIL=70 part "bench_attnres train + profile + decode" 230 python3 -m kimi_vl.benchmarks.bench_attnres \
    --sources 4 --rounds 3 --hybrid-iters 3 --profile --budget-s 150
  export APP_STEPS=24
  base="data.batch_size=16"
  for round in a b; do
    APP_OVERRIDES="$base" app16 sinks_$round KVL_ATTNRES_DEFER_GRAD=0
    APP_OVERRIDES="$base" app16 defer_$round KVL_ATTNRES_DEFER_GRAD=1
  done
  app_compare sinks_a defer_a
  app_compare sinks_b defer_b
  app_compare sinks_a sinks_b
  summarize sinks_a defer_a sinks_b defer_b
  ;;
final)
  DATA=${2:?usage: gpu_session12.sh final DATA}
  PART_TAIL=8 part "gpu tests: AttnRes model" 150 python3 -m pytest -q -p no:cacheprovider tests/model/test_attn_res.py
  PART_TAIL=30 part "bench_attnres stream cost + hybrid decode" 200 python3 -m kimi_vl.benchmarks.bench_attnres \
    --sources 4 --stream-cost --decode-only --rounds 5 --budget-s 150
  export APP_STEPS=24
  APP_OVERRIDES="data.batch_size=24" app16 b24
  summarize b24
  ;;
launch)
  PART_TAIL=8 part "gpu tests: two-phase" 150 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py -k "two_phase or gpu or generate"
  PART_TAIL=30 part "bench_attnres stream cost + decode" 200 python3 -m kimi_vl.benchmarks.bench_attnres \
    --sources 4 --stream-cost --decode-only --rounds 5 --budget-s 150
  ;;
profile)
  DATA=${2:?usage: gpu_session12.sh profile DATA}
  PART_TAIL=70 part "profile app step, batch 24" 280 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=24 data.num_workers=8 \
    --steps 2 --warmup 4 --module-steps 0 --pipeline-steps 6 --torch-profile --host-profile --out "$OUT/profile_b24"
  ;;
esac
ls -la "$OUT"
