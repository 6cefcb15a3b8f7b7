#!/usr/bin/env bash
# One GPU call for the model-level benchmarks (run from the repo root on the GPU machine):
#   bash scripts/gpu_bench_models.sh        -> $OUT/{bench_backbone,bench_muon,bench_moonvit}.json + logs
# Each benchmark has its own time limit so one slow part cannot eat the others' time.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
timeout 80 python3 -m kimi_vl.benchmarks.bench_muon 2>&1 | tail -n 25 | tee "$OUT/muon.log"
timeout 100 python3 -m vision_encoder.benchmarks.bench_moonvit 2>&1 | tail -n 25 | tee "$OUT/moonvit.log"
timeout 200 python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts 32768 131072 --iters 3 \
  --peak-tflops 709 2>&1 | tail -n 40 | tee "$OUT/backbone.log"
ls -la "$OUT"
