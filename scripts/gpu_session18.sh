#!/usr/bin/env bash
# Prepared in session 17 for the next session's GPU calls (results: docs/results/gpu-<date>-s18/):
#   bash scripts/gpu_session18.sh diag     the KDA forward with the diagonal blocks of Akk / Aqk formed outside the
#       scores kernel (DIAG_BLOCKS = "kernel": a kernel of their own; "prep": the prep kernel, from the tiles it
#       holds). Without them the scores kernel needs 156 registers and no spills, against 168 with 284 bytes of spills
#       (ptxas_regs, Triton 3.9). Its GPU tests, then sweep_kda_fwd.py's diag settings at 1 x 8192 x 32 and
#       4 x 4096 x 32 with fla in the run, then ab_kda.py (forward + backward) for DIAG_BLOCKS="kernel" and "prep"
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session18.sh diag}" in
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
esac
ls -la "$OUT"
