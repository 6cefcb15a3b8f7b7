#!/usr/bin/env bash
# Two-GPU training check (issue 9), run from the repo root on the 2-GPU kind:
#   bash scripts/gpu_dist_train.sh DATA_DIR [STEPS]
# For DDP and FSDP2 (configs/accelerate/{ddp,fsdp2}.yaml): `small` joint pretraining for STEPS steps with a
# checkpoint every STEPS/2, then the same command with max_steps = 1.5 * STEPS, which must resume from the last
# checkpoint and continue. Logs and metrics go to $OUT/dist_<mode>_{a,b}.log and $OUT/dist_train.tar.gz.
# KVL_DIST_MODES (default "ddp fsdp2"), KVL_DIST_LIMIT_A / _B (seconds per launch, default 200 / 150).
set -u
DATA=${1:?usage: gpu_dist_train.sh DATA_DIR [STEPS]}
STEPS=${2:-20}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out} TOKENIZERS_PARALLELISM=false
# NVLink multicast stays off on the shared hosts (device notes); exported so every launched process keeps it
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT" runs/dist
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"

launch() {  # mode tag max_steps limit_s
  local mode=$1 tag=$2 steps=$3 limit=$4 precision=()
  [ "$mode" = fsdp2 ] && precision=(precision=bf16)  # bf16_params (small_pretrain's default) is for 1 process or DDP
  echo "== $mode $tag: max_steps=$steps"
  timeout "$limit" accelerate launch --config_file "configs/accelerate/$mode.yaml" -m kimi_vl.train \
    --config kimi_vl/configs/small_pretrain.yaml output_dir="runs/dist/$mode" max_steps="$steps" \
    data.path="$DATA" data.batch_size=4 data.num_workers=4 checkpoint_every=$((STEPS / 2)) eval_every=1000 \
    optim.warmup_steps=5 optim.total_steps=$((STEPS * 3 / 2)) "${precision[@]}" > "runs/dist/${mode}_${tag}.log" 2>&1
  echo "$mode $tag exit $?" | tee -a "$OUT/dist_status.txt"
  {  # the first error with its traceback (rank-prefixed lines), then the end of the log
    grep -v "^\s*$" "runs/dist/${mode}_${tag}.log" | grep -m1 -B2 -A40 "Traceback" | grep -v "\^\^\^"
    echo "-- tail"
    grep -v "^\s*$" "runs/dist/${mode}_${tag}.log" | tail -n 15
  } > "$OUT/dist_${mode}_${tag}.log"
  grep -h "^\[train\]\|step=" "runs/dist/${mode}_${tag}.log" | tail -n 4
}

for mode in ${KVL_DIST_MODES:-ddp fsdp2}; do
  launch "$mode" a "$STEPS" "${KVL_DIST_LIMIT_A:-200}"
  launch "$mode" b $((STEPS * 3 / 2)) "${KVL_DIST_LIMIT_B:-150}"
  grep -h "resumed from" "runs/dist/${mode}_b.log" | tee -a "$OUT/dist_status.txt"
done
tar czf "$OUT/dist_train.tar.gz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
  --exclude='*.distcp' runs/dist
ls -la "$OUT"
