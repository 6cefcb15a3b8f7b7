#!/usr/bin/env bash
# One H100 call: where the training app's step goes (issue 9), then the same-run KDA table vs fla-core (issue 4).
#   bash scripts/gpu_profile_app.sh DATA_DIR
# 1. profile_train_step on small_pretrain (bf16, seq 4096, batch 4) with a torch.profiler table and dynamo
#    recompile logging;
# 2. a 12-step run of the app itself (its own tokens/s and MFU in metrics.jsonl);
# 3. bench_kda.py ours vs fla-core at the five issue shapes (fla autotunes ~2 min per head count).
set -u
DATA=${1:?usage: gpu_profile_app.sh DATA_DIR}
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false PART_TAIL=60
gpu_header
mkdir -p "$OUT/app"
TORCH_LOGS=recompiles part "profile_train_step small_pretrain" 140 python3 -m kimi_vl.benchmarks.profile_train_step \
  --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=4 data.num_workers=8 \
  --steps 4 --warmup 2 --torch-profile --out "$OUT/app"
part "app, 12 steps" 75 python3 -m kimi_vl.train --config kimi_vl/configs/small_pretrain.yaml \
  output_dir=/tmp/runs/app12 max_steps=12 data.path="$DATA" data.batch_size=4 data.num_workers=8 \
  eval_every=1000 checkpoint_every=1000 optim.warmup_steps=2 optim.total_steps=12
cp /tmp/runs/app12/metrics.jsonl "$OUT/app12_metrics.jsonl" 2>/dev/null
install_fla
part "KDA ours vs fla, five shapes" 320 python3 kernels/benchmarks/bench_kda.py --impls ours,fla \
  --no-prelude --deadline 300 --out "$OUT/bench_kda_vs_fla.json"
ls -la "$OUT"
