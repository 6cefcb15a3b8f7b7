#!/usr/bin/env bash
# Session 7's GPU checks, one H100 call per PART (run from the repo root on the GPU machine):
#   bash scripts/gpu_session7.sh kernels     GPU tests of the changed kernels, the KDA forward sweep vs fla at two
#                                            shapes, bench_attnres (training-step overhead)
#   bash scripts/gpu_session7.sh app DATA    MoonViT profile, the app's host profile and 16-step runs, eager and
#                                            with compile_vision
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false
gpu_header
case "${1:?usage: gpu_session7.sh kernels|app [DATA]}" in
kernels)
  install_fla
  use_fla_tuning_cache
  part gpu_tests 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/kernels/test_kda_fwd_variants.py \
    tests/kernels/test_kda_triton.py tests/kernels/test_kda_bwd.py tests/kernels/test_rope2d.py tests/optim/test_fused.py \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py
  for shape in 4x4096x32; do
    PART_TAIL=30 part "sweep_kda_fwd $shape" 150 python3 kernels/benchmarks/sweep_kda_fwd.py --shape "$shape" \
      --only "${KVL_SWEEP:-default}" --out "$OUT/sweep_kda_fwd_$shape.json"
  done
  PART_TAIL=30 part bench_kda 200 python3 kernels/benchmarks/bench_kda.py --no-prelude --impls ours,fla --deadline 150 \
    --shapes 4x4096x32,1x8192x32 --out "$OUT/bench_kda.json"
  part bench_attnres 150 python3 -m kimi_vl.benchmarks.bench_attnres --budget-s 60
  ;;
app)
  DATA=${2:?usage: gpu_session7.sh app DATA}
  [ "${KVL_SKIP_MOONVIT:-0}" = 1 ] || part moonvit 60 python3 -m vision_encoder.benchmarks.profile_moonvit --json profile_moonvit_app12.json
  [ "${KVL_SKIP_MOONVIT:-0}" = 1 ] || part "moonvit 44 chunks" 80 python3 -m vision_encoder.benchmarks.profile_moonvit --chunks 40,4 \
    --json profile_moonvit_chunks44.json
  for cv in ${KVL_COMPILE_VISION:-false true}; do
    PART_TAIL=30 part "profile app compile_vision=$cv" 200 python3 -m kimi_vl.benchmarks.profile_train_step \
      --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=8 data.num_workers=8 \
      compile_vision=$cv --steps 3 --warmup 2 --module-steps 0 --host-profile --out "$OUT/app_cv_$cv"
    part "app16 compile_vision=$cv" 150 python3 -m kimi_vl.train --config kimi_vl/configs/small_pretrain.yaml \
      output_dir=/tmp/runs/app16_$cv max_steps=16 data.path="$DATA" data.num_workers=8 eval_every=1000 \
      checkpoint_every=1000 optim.warmup_steps=2 optim.total_steps=16 compile_vision=$cv
    cp /tmp/runs/app16_$cv/metrics.jsonl "$OUT/app16_cv_${cv}_metrics.jsonl" 2>/dev/null
  done
  ;;
esac
ls -la "$OUT"
