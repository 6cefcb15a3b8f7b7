#!/usr/bin/env bash
# Session 43's GPU plan (written without a GPU: the device was not lent in session 43; run it in a later session):
#   bash scripts/gpu_session43.sh swiglu   issue 5: the dense SwiGLU's activation inside Triton GEMMs
#       (kernels/swiglu, KVL_SWIGLU_IMPL=fused). Its GPU tests; bench_swiglu.py --sweep (each fused kernel against
#       the cuBLAS GEMM + silu_mul pair it replaces, the whole MLP, the tilings of FWD_SWEEP / BWD_SWEEP); then the
#       small hybrid's profiled training step at 4096 with the split and the fused MLP, interleaved twice, in a copy
#       of the tree whose GPU_CONFIG is the sweep's best pair. Also session 43's CPU-written tests that behave
#       differently with CUDA (bf16 KDA without the interpreter's widening; kimi-vl eval's --device default).
#       About 5 minutes.
#   bash scripts/gpu_session43.sh split    issue 4: session 42's prepared unequal-pieces run (gpu_session42.sh split).
set -u
source "$(dirname "$0")/gpu_parts.sh"

step() {  # name impl: bench_backbone --profile of the hybrid's step at 4096 in /tmp/flip with KVL_SWIGLU_IMPL=impl
  mkdir -p "$OUT/$1"
  (cd /tmp/flip && OUT=$OUT/$1 KVL_SWIGLU_IMPL=$2 PART_TAIL=4 part "hybrid step at 4096, $1 (KVL_SWIGLU_IMPL=$2)" \
    170 python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 3 --profile \
    --variants hybrid)
  python3 scripts/backbone_summary.py "$OUT/$1/bench_backbone.json" "swiglu gemm" | tee -a "$LOG"
}

gpu_header
case "${1:?usage: gpu_session43.sh swiglu|split}" in
swiglu)
  PART_TAIL=8 part "SwiGLU GEMM tests (and session 43's bf16 KDA test) on the GPU" 150 python3 -m pytest -q \
    -p no:cacheprovider -rf tests/kernels/test_swiglu.py tests/model/test_bench_backbone.py \
    tests/kernels/test_kda_triton.py::test_triton_bf16_is_bf16_accurate tests/eval/test_eval_cli.py
  PART_TAIL=30 part "bench_swiglu --sweep" 240 python3 kernels/benchmarks/bench_swiglu.py --sweep \
    --out "$OUT/bench_swiglu.json"
  if [ -s "$OUT/swiglu_gpu_config.txt" ]; then
    flipped_tree kernels/swiglu/swiglu_triton.py "s/^GPU_CONFIG = .*/$(cat "$OUT/swiglu_gpu_config.txt")/"
  else
    flipped_tree kernels/swiglu/swiglu_triton.py "s/^GPU_CONFIG = /GPU_CONFIG = /"
  fi
  for round in a b; do
    step "split_$round" split
    step "fused_$round" fused
  done
  ;;
split)
  bash "$(dirname "$0")/gpu_session42.sh" split
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
