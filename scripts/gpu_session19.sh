#!/usr/bin/env bash
# Prepared in session 18 for the next session's GPU calls (results: docs/results/gpu-<date>-s19/):
#   bash scripts/gpu_session19.sh solve   the KDA scores kernel's diagonal inverses reading Akk's rows from memory
#       (SOLVE_ROW_LOADS; bit-equal in the interpreter): the KDA test files on the GPU (session 18 call3 ran only 27
#       tests of the batched off-diagonal kernel before a time limit), then sweep_kda_fwd.py at 1 x 8192 x 32 and
#       4 x 4096 x 32 (with the scores kernel's launch settings again, as the batched off-diagonal dot changed its
#       registers), then bench_kda.py at 1 x 8192 x 32 with graph-replayed forwards (no
#       Nsight Compute: the one-GPU H200 kind runs under gVisor, which reads no counters).
#   bash scripts/gpu_session19.sh bench   ours vs fla at the issue's five shapes (bench_kda.py, no prelude), with each
#       forward also replayed as a CUDA graph (--graph): device time free of the host launch cost that made fla's
#       forward host-bound at 1 x 8192 x 32 and 8 x 2048 x 16 (session 18 call4).
# Part limits sum to 540 s (one command may run 600).
# install_fla seeds Triton's cache with fla's committed H100 tuning results (kernels/benchmarks/fla_tuning/); without
# them fla re-tunes for minutes (session 18 call3).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session19.sh solve|bench}" in
solve)
  install_fla
  PART_TAIL=8 part "KDA tests on the GPU (forward and backward files, all of them)" 150 python3 -m pytest -q -n 14 \
    -p no:cacheprovider -rf tests/kernels/test_kda_triton.py tests/kernels/test_kda_bwd.py
  for shape in 1x8192x32:200 4x4096x32:80; do  # shape:limit_s (the second shape reuses the compiled kernels)
    limit=${shape#*:} shape=${shape%:*}
    mkdir -p "$OUT/$shape"
    PART_TAIL=30 part "sweep_kda_fwd: solve row loads, $shape" "$limit" python3 kernels/benchmarks/sweep_kda_fwd.py \
      --shape "$shape" --out "$OUT/$shape/sweep_kda_fwd.json" --only "solve rows,solve rows w8 nreg128,scores s2,\
scores w8 nreg128,wu 64"
  done
  # the one-GPU H200 kind runs under gVisor, where Nsight Compute reads no counters (KINDS.md): the graph-replayed
  # forward against fla at the first shape instead, so that this call already answers the bench question there
  PART_TAIL=20 part "bench_kda ours vs fla at 1x8192x32, with CUDA-graph forwards" 110 python3 \
    kernels/benchmarks/bench_kda.py --no-prelude --graph --impls ours,fla --deadline 90 --shapes 1x8192x32 \
    --out "$OUT/bench_kda_1x8192x32.json"
  ;;
bench)
  install_fla
  PART_TAIL=40 part "bench_kda ours vs fla, with CUDA-graph forwards" 300 python3 kernels/benchmarks/bench_kda.py \
    --no-prelude --graph --impls ours,fla --deadline 240 --shapes 1x8192x32,4x4096x32,8x2048x16,2x16384x16,1x32768x16 \
    --out "$OUT/bench_kda.json"
  ;;
esac
ls -la "$OUT"
