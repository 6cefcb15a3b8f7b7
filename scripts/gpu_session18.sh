#!/usr/bin/env bash
# Session 18's GPU calls (results: docs/results/gpu-2026-11-28-s18/):
#   bash scripts/gpu_session18.sh diag      (call1) the KDA forward with the diagonal blocks of Akk / Aqk formed outside
#       the scores kernel (DIAG_BLOCKS = "kernel": a kernel of their own; "prep": the prep kernel, from the tiles it
#       holds): GPU tests, sweep_kda_fwd.py's diag settings at 1 x 8192 x 32 and 4 x 4096 x 32 with fla in the run,
#       then ab_kda.py (forward + backward) for DIAG_BLOCKS="kernel" and "prep"
#   bash scripts/gpu_session18.sh batched   (call2) the off-diagonal blocks as one batched dot (OFFDIAG_BATCHED),
#       alone and with the diagonal blocks in the prep kernel (16-column tiles) or in a kernel of their own: GPU tests,
#       the sweep at both shapes, then ab_kda.py (forward + backward, fla in the run) of batched + diag prep bk16
#   (diag and batched ran at commits 4ee9455 and 3267fea; their constants were removed after call2.)
#   bash scripts/gpu_session18.sh final     (call3) the batched off-diagonal kernel as the default: the KDA forward GPU
#       tests, bench_kda.py against fla at the issue's shapes, and the scores kernel's register cap at 192 / 255
#       (fla's tuning, with no cache carried, outlasted bench_kda's limit)
#   bash scripts/gpu_session18.sh fla       (call4) bench_kda.py, ours vs fla, with fla's tuning results of session 5
#       (docs/results/gpu-2026-11-22-s5/call7_h100/fla_autotune.tar.gz unpacked into the snapshot's .fla_tcache/)
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session18.sh diag|batched|final|fla}" in
diag)
  install_fla
  PART_TAIL=8 part "KDA GPU tests (diagonal blocks, forward intermediates)" 90 python3 -m pytest -q \
    -p no:cacheprovider -rf tests/kernels/test_kda_triton.py -k "diagonal or fwd_intermediates"
  for shape in 1x8192x32 4x4096x32; do
    mkdir -p "$OUT/$shape"
    PART_TAIL=30 part "sweep_kda_fwd: diagonal blocks, $shape" 200 python3 kernels/benchmarks/sweep_kda_fwd.py \
      --shape "$shape" --out "$OUT/$shape/sweep_kda_fwd.json" --only "diag kernel,diag kernel nreg160,diag kernel w8,\
diag prep,diag prep nreg160,diag prep w8,diag prep bk16"
  done
  for where in kernel prep; do
    mkdir -p "$OUT/ab_$where"
    PART_TAIL=12 part "ab_kda: diagonal blocks in the $where, forward + backward" 150 env OUT="$OUT/ab_$where" \
      python3 kernels/benchmarks/ab_kda.py --set "DIAG_BLOCKS='$where'" --shapes 1x8192x32 --rounds 3 --no-fla
  done
  ;;
batched)
  install_fla
  PART_TAIL=8 part "KDA GPU tests (scores forms, forward intermediates)" 90 python3 -m pytest -q \
    -p no:cacheprovider -rf tests/kernels/test_kda_triton.py -k "scores_forms or fwd_intermediates"
  for shape in 1x8192x32 4x4096x32; do
    mkdir -p "$OUT/$shape"
    PART_TAIL=30 part "sweep_kda_fwd: batched off-diagonal blocks, $shape" 220 python3 \
      kernels/benchmarks/sweep_kda_fwd.py --shape "$shape" --out "$OUT/$shape/sweep_kda_fwd.json" --only "diag prep bk16,\
diag prep bk16 s1,batched,batched diag kernel,batched diag prep bk16,batched diag prep bk16 nreg-,\
batched diag prep bk16 bk32 nreg-"
  done
  mkdir -p "$OUT/ab"
  PART_TAIL=12 part "ab_kda: batched + diag prep bk16, forward + backward" 200 env OUT="$OUT/ab" \
    python3 kernels/benchmarks/ab_kda.py --set OFFDIAG_BATCHED=True "DIAG_BLOCKS='prep'" PREP_BK=16 \
    --shapes 1x8192x32 4x4096x32 --rounds 3
  ;;
final)
  install_fla
  PART_TAIL=8 part "KDA forward GPU tests" 120 python3 -m pytest -q -p no:cacheprovider -rf \
    tests/kernels/test_kda_triton.py
  PART_TAIL=30 part "bench_kda ours vs fla" 270 python3 kernels/benchmarks/bench_kda.py --no-prelude \
    --impls ours,fla --deadline 240 --shapes 1x8192x32,4x4096x32,8x2048x16,2x16384x16,1x32768x16
  PART_TAIL=12 part "sweep_kda_fwd: scores register cap" 90 python3 kernels/benchmarks/sweep_kda_fwd.py \
    --shape 1x8192x32 --only "scores nreg255,scores nreg192"
  ;;
fla)
  install_fla
  use_fla_tuning_cache
  PART_TAIL=40 part "bench_kda ours vs fla (fla's tuning cache)" 170 python3 kernels/benchmarks/bench_kda.py \
    --no-prelude --impls ours,fla --deadline 120 --shapes 1x8192x32,4x4096x32,8x2048x16,2x16384x16,1x32768x16 \
    --out "$OUT/bench_kda.json"
  ;;
esac
ls -la "$OUT"
