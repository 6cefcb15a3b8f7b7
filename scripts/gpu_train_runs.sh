#!/usr/bin/env bash
# One GPU call for the training-app and RL measurements (issues 9 and 10), run from the repo root on the GPU machine:
#   bash scripts/gpu_train_runs.sh DATA_DIR [PRETRAIN_STEPS] [SFT_STEPS] [RL_STEPS]
# DATA_DIR: a `kimi-vl data synth --preset small` output (or a subset of its shards, with its tokenizer and manifest).
# Runs `small` joint pretraining (bf16, seq 4096), a short zero-vision SFT from its export, and vision RL from the SFT
# export; plots every run's curves and bundles metrics + PNGs into $OUT/train_runs.tar.gz (plus the logs).
# Each stage has its own time limit (seconds; env KVL_PRE_LIMIT, KVL_SFT_LIMIT, KVL_RL_LIMIT, defaults 220 / 100 / 210);
# a stage cut by its limit still leaves its metrics.jsonl for the plot. KVL_RL_ARGS: extra key=value overrides for RL.
set -u
DATA=${1:?usage: gpu_train_runs.sh DATA_DIR [PRETRAIN_STEPS] [SFT_STEPS] [RL_STEPS]}
PRE=${2:-200}
SFT=${3:-60}
RL=${4:-100}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out} TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT" runs/gpu
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"

run_stage() {  # name limit_s module config overrides...
  local name=$1 limit=$2 module=$3 cfg=$4
  shift 4
  echo "== $name ($module, $cfg, limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" python3 -m "$module" --config "$cfg" output_dir="runs/gpu/$name" "$@" 2>&1 \
    | grep -v "^\s*$" | tail -n 30 | tee "$OUT/$name.log"
  echo "$name wall ${SECONDS}-${t0} = $((SECONDS - t0)) s" | tee -a "$OUT/stages.txt"
  python3 -m kimi_vl.train.plot "runs/gpu/$name" --out "runs/gpu/$name/curves.png" 2>&1 | tail -n 2
}

run_stage small_pretrain "${KVL_PRE_LIMIT:-220}" kimi_vl.train kimi_vl/configs/small_pretrain.yaml \
  max_steps="$PRE" data.path="$DATA" data.num_workers=8 eval_every=50 checkpoint_every=100 \
  optim.warmup_steps=20 optim.total_steps="$PRE"
run_stage small_sft_zero_vision "${KVL_SFT_LIMIT:-100}" kimi_vl.train kimi_vl/configs/small_sft_zero_vision.yaml \
  init_from=runs/gpu/small_pretrain/final max_steps="$SFT" data.path="$DATA" data.num_workers=8 \
  eval_every=30 checkpoint_every=1000 optim.warmup_steps=5 optim.total_steps="$SFT"
run_stage small_rl "${KVL_RL_LIMIT:-210}" rl kimi_vl/configs/small_rl.yaml \
  init_from=runs/gpu/small_sft_zero_vision/final max_steps="$RL" data.path="$DATA" ${KVL_RL_ARGS:-}

python3 - <<'EOF' | tee "$OUT/summary.txt"
# Throughput summary from the runs' metrics (median over steps after the first 5).
import json, statistics
from pathlib import Path
for name in ("small_pretrain", "small_sft_zero_vision", "small_rl"):
    path = Path("runs/gpu") / name / "metrics.jsonl"
    if not path.exists():
        print(name, "no metrics")
        continue
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]
    steps = [r for r in recs if "loss" in r or "reward/mean" in r or "time_rollout_s" in r][5:]
    out = {"steps_logged": len(recs)}
    for key in ("tokens_per_s", "mfu", "step_time_s", "time_rollout_s", "time_update_s", "rollout/tokens_per_s",
                "gen_tokens_per_s"):
        vals = [r[key] for r in steps if isinstance(r.get(key), (int, float))]
        if vals:
            out[key] = statistics.median(vals)
    if "time_rollout_s" in out and "time_update_s" in out:
        out["generation_share"] = out["time_rollout_s"] / (out["time_rollout_s"] + out["time_update_s"])
    print(name, json.dumps(out))
EOF
tar czf "$OUT/train_runs.tar.gz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
  --exclude='checkpoints' --exclude='final' runs/gpu
ls -la "$OUT"
