#!/usr/bin/env bash
# Session 10's GPU checks, one H100 call per PART (run from the repo root on the GPU machine):
#   bash scripts/gpu_session10.sh batch DATA   the app (small_pretrain, 24 steps) in one call: a 6-step warm-up run,
#       then at batch 8: precision=bf16 (autocast over fp32 weights), bf16_params with the flat cast (this commit),
#       bf16_params with the per-parameter foreach cast (commit 37ba638 in old/), bf16_params with the collector
#       frozen (gc_every=50); then batch 16 with bf16_params and with bf16. The app is host-bound at batch 8 (its
#       CPU time is about its step time), so twice the tokens a step should cost much less than twice the time.
#       gc_every=0 runs log gc_s for the steps that had an automatic full collection.
#   bash scripts/gpu_session10.sh batch2 DATA  bf16_params at batch 24 and 16 (24 steps), then a synchronised
#       profile of batch 16 (torch profiler: GPU busy time against the step; the bare fwd+bwd variants at batch 16).
#   bash scripts/gpu_session10.sh overlap DATA  no host sync inside a step (this commit) against commit c2fe3a8 in
#       old/ (syncs at the splice, its backward, QK-Clip's decision and the end of the step), bf16_params at batch
#       16 and 8 (old new new old), the new code with defer_metrics=false, the GPU tests of the sync-free splice,
#       and the syncs left in the app's queue_step (profile_train_step, batch 16)
#   bash scripts/gpu_session10.sh overlap2 DATA  the same comparison at batch 16 in one call: old new old new
#   bash scripts/gpu_session10.sh batch3 DATA  this commit at batch 24 and 16 (bf16_params, 24 steps)
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

gpu_header
case "${1:?usage: gpu_session10.sh batch|batch2|overlap|overlap2|batch3 DATA}" in
batch)
  DATA=${2:?usage: gpu_session10.sh batch DATA}
  APP_STEPS=6 APP_OVERRIDES="precision=bf16_params" app16 warmup KVL_NOTHING=1
  export APP_STEPS=24
  APP_OVERRIDES="precision=bf16 gc_every=0" app16 bf16_b8 KVL_NOTHING=1
  APP_OVERRIDES="precision=bf16_params gc_every=0" app16 flat_b8 KVL_NOTHING=1
  APP_DIR=old APP_OVERRIDES="precision=bf16_params" app16 foreach_b8 KVL_NOTHING=1
  APP_OVERRIDES="precision=bf16_params" app16 flat_gc50_b8 KVL_NOTHING=1
  APP_OVERRIDES="precision=bf16_params data.batch_size=16" app16 flat_b16 KVL_NOTHING=1
  APP_OVERRIDES="precision=bf16 data.batch_size=16" app16 bf16_b16 KVL_NOTHING=1
  app_compare bf16_b8 flat_b8
  app_compare foreach_b8 flat_b8
  app_compare flat_b8 flat_gc50_b8
  app_compare bf16_b16 flat_b16
  summarize bf16_b8 flat_b8 foreach_b8 flat_gc50_b8 flat_b16 bf16_b16
  ;;
batch2)
  DATA=${2:?usage: gpu_session10.sh batch2 DATA}
  export APP_STEPS=24
  APP_OVERRIDES="precision=bf16_params data.batch_size=24" app16 flat_b24 KVL_NOTHING=1
  APP_OVERRIDES="precision=bf16_params data.batch_size=16" app16 flat_b16 KVL_NOTHING=1
  summarize flat_b24 flat_b16
  PART_TAIL=60 part "profile app bf16_params batch 16" 240 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=16 data.num_workers=8 \
    precision=bf16_params --steps 3 --warmup 8 --module-steps 0 --torch-profile --out "$OUT/app_params_b16"
  ;;
overlap)
  DATA=${2:?usage: gpu_session10.sh overlap DATA}
  [ -n "${SKIP_TESTS:-}" ] || PART_TAIL=8 part "gpu tests: sync-free splice, QK-Clip" 120 python3 -m pytest -q \
    -p no:cacheprovider -m gpu tests/vision/test_multimodal.py tests/optim/test_qk_clip.py tests/optim/test_fused.py
  export APP_STEPS=24
  base="precision=bf16_params gc_every=0"
  APP_DIR=old APP_OVERRIDES="$base data.batch_size=16" app16 old_b16 KVL_NOTHING=1
  APP_OVERRIDES="$base data.batch_size=16" app16 new_b16 KVL_NOTHING=1
  APP_OVERRIDES="$base data.batch_size=8" app16 new_b8 KVL_NOTHING=1
  APP_DIR=old APP_OVERRIDES="$base data.batch_size=8" app16 old_b8 KVL_NOTHING=1
  APP_OVERRIDES="$base data.batch_size=16 defer_metrics=false" app16 nodefer_b16 KVL_NOTHING=1
  app_compare old_b16 new_b16
  app_compare old_b8 new_b8
  app_compare old_b16 nodefer_b16
  app_compare nodefer_b16 new_b16
  summarize old_b16 new_b16 nodefer_b16 old_b8 new_b8
  PART_TAIL=30 part "profile app bf16_params batch 16 (syncs)" 200 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=16 data.num_workers=8 \
    --steps 2 --warmup 4 --module-steps 0 --out "$OUT/app_b16"
  ;;
overlap2)
  DATA=${2:?usage: gpu_session10.sh overlap2 DATA}
  export APP_STEPS=24
  base="precision=bf16_params gc_every=0 data.batch_size=16"
  APP_DIR=old APP_OVERRIDES="$base" app16 old_c KVL_NOTHING=1
  APP_OVERRIDES="$base" app16 new_c KVL_NOTHING=1
  APP_DIR=old APP_OVERRIDES="$base" app16 old_d KVL_NOTHING=1
  APP_OVERRIDES="$base" app16 new_d KVL_NOTHING=1
  app_compare old_c new_c
  app_compare old_d new_d
  app_compare old_c old_d
  summarize old_c new_c old_d new_d
  ;;
batch3)
  DATA=${2:?usage: gpu_session10.sh batch3 DATA}
  export APP_STEPS=24
  APP_OVERRIDES="data.batch_size=24" app16 b24 KVL_NOTHING=1
  APP_OVERRIDES="data.batch_size=16" app16 b16 KVL_NOTHING=1
  summarize b24 b16
  ;;
esac
ls -la "$OUT"
