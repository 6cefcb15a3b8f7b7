#!/usr/bin/env bash
# Session 8's GPU checks, one H100 call per PART (run from the repo root on the GPU machine):
#   bash scripts/gpu_session8.sh probe DATA   host cost per call of GEMMs (fixed vs changing row count), Triton
#                                             launches; the app's 16-step run with and without OMP_NUM_THREADS=1
#                                             (A, B, A again: the spread of A against A is the call's noise)
#   bash scripts/gpu_session8.sh vision DATA  GPU test of the row bucketing; app24 of the commit before the GEMM
#                                             shape bucketing (old/, a git archive) against this one; the
#                                             synchronised phase profile
#   bash scripts/gpu_session8.sh nsgraph DATA GPU tests of the graphed Newton-Schulz; app24 eager, graphed,
#                                             eager again; phase profiles of both
#   bash scripts/gpu_session8.sh joint DATA   app24 of the commit before the joint image+video tower call (old/)
#                                             against this one; a steady-state profile with the torch profiler
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

gpu_header
case "${1:?usage: gpu_session8.sh probe|vision|nsgraph|joint DATA}" in
probe)
  DATA=${2:?usage: gpu_session8.sh probe DATA}
  PART_TAIL=30 part host_costs 90 python3 kernels/benchmarks/host_costs.py --out "$OUT/host_costs.json"
  app16 base_a KVL_NOTHING=1
  app16 omp1 OMP_NUM_THREADS=1
  app16 base_b KVL_NOTHING=1
  ;;
vision)  # the GEMM-shape bucketing of the vision tower (row_bucket, SIZE_ALIGN) and cpu_threads against the
         # commit before them (its archive in old/), 24 steps each
  DATA=${2:?usage: gpu_session8.sh vision DATA}
  part gpu_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/vision/test_row_bucket.py
  PART_TAIL=30 part host_costs 90 python3 kernels/benchmarks/host_costs.py --out "$OUT/host_costs.json"
  APP_STEPS=24 APP_DIR=old app16 old KVL_NOTHING=1
  APP_STEPS=24 app16 new KVL_NOTHING=1
  APP_STEPS=24 app16 new_threads16 KVL_NOTHING=1 OMP_NUM_THREADS=16
  APP_STEPS=24 APP_DIR=old app16 old_b KVL_NOTHING=1
  PART_TAIL=30 part "profile app new" 200 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=8 data.num_workers=8 \
    --steps 3 --warmup 2 --module-steps 0 --out "$OUT/app_new"
  ;;
nsgraph)  # Muon's normalise + Newton-Schulz as one CUDA graph (optim.ns_cuda_graph) against eager, 24 steps each
  DATA=${2:?usage: gpu_session8.sh nsgraph DATA}
  part gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/optim/test_fused.py \
    tests/vision/test_row_bucket.py
  APP_STEPS=24 APP_OVERRIDES=optim.ns_cuda_graph=false app16 eager_a KVL_NOTHING=1
  APP_STEPS=24 app16 graph KVL_NOTHING=1
  APP_STEPS=24 APP_OVERRIDES=optim.ns_cuda_graph=false app16 eager_b KVL_NOTHING=1
  for g in true false; do
    PART_TAIL=24 part "profile app ns_cuda_graph=$g" 150 python3 -m kimi_vl.benchmarks.profile_train_step \
      --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=8 data.num_workers=8 \
      optim.ns_cuda_graph=$g --steps 3 --warmup 4 --module-steps 0 --out "$OUT/app_graph_$g"
  done
  ;;
joint)  # images and video chunks in one tower call against the commit before (old/), 24 steps each; a steady-state
        # phase profile with the torch profiler (GPU busy share)
  DATA=${2:?usage: gpu_session8.sh joint DATA}
  APP_STEPS=24 APP_DIR=old app16 old KVL_NOTHING=1
  APP_STEPS=24 app16 joint KVL_NOTHING=1
  APP_STEPS=24 APP_DIR=old app16 old_b KVL_NOTHING=1
  PART_TAIL=60 part "profile app joint" 200 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=8 data.num_workers=8 \
    --steps 3 --warmup 6 --module-steps 0 --torch-profile --out "$OUT/app_joint"
  ;;
esac
ls -la "$OUT"
