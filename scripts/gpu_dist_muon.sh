#!/usr/bin/env bash
# Distributed MuonClip on the 2-GPU H200 kind (issue 7), one command from the repo root (torchrun via python3 -m):
#   bash scripts/gpu_dist_muon.sh      -> $OUT/dist_muon.json + $OUT/dist_muon.log
# DDP and FSDP2 updates vs one process (bf16 NS: same-gradient check; fp32 NS: end to end), and bus bytes per
# training step counted around every collective, MuonClip vs AdamW (target ratio <= 1.25). About 1 minute.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out} OMP_NUM_THREADS=4
# NVLink multicast stays off on the shared hosts (device notes): keep these set for the child processes too
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 170 python3 -m torch.distributed.run --standalone --nproc_per_node 2 -m kimi_vl.benchmarks.dist_muon --device cuda 2>&1 \
  | grep -v -i "warn" | tail -n 30 | tee "$OUT/dist_muon.log"
