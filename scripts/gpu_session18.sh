#!/usr/bin/env bash
# Prepared in session 17 for the next session's GPU calls (results: docs/results/gpu-<date>-s18/):
#   bash scripts/gpu_session18.sh diag     the KDA forward with the diagonal blocks of Akk / Aqk in a kernel of their
#       own (DIAG_SEPARATE: the scores kernel then needs 156 registers and no spills, against 168 with 284 bytes of
#       spills; ptxas_regs, Triton 3.9): its GPU tests, then sweep_kda_fwd.py's diag settings at 1 x 8192 x 32 and
#       4 x 4096 x 32 with fla in the run; then ab_kda.py for the forward + backward of the best one
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session18.sh diag}" in
diag)
  install_fla
  PART_TAIL=8 part "KDA GPU tests (diagonal kernel, forward intermediates)" 90 python3 -m pytest -q \
    -p no:cacheprovider -rf tests/kernels/test_kda_triton.py -k "diagonal or fwd_intermediates"
  for shape in 1x8192x32 4x4096x32; do
    mkdir -p "$OUT/$shape"
    PART_TAIL=30 part "sweep_kda_fwd: diagonal kernel, $shape" 200 python3 kernels/benchmarks/sweep_kda_fwd.py \
      --shape "$shape" --out "$OUT/$shape/sweep_kda_fwd.json" \
      --only "diag separate,diag separate nreg160,diag separate w8,diag separate s2"
  done
  PART_TAIL=12 part "ab_kda: diagonal kernel, forward + backward" 200 python3 kernels/benchmarks/ab_kda.py \
    --set DIAG_SEPARATE=True --shapes 1x8192x32 --rounds 3 --no-fla
  ;;
esac
ls -la "$OUT"
