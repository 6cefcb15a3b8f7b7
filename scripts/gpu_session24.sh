#!/usr/bin/env bash
# Session 24's GPU calls (results: docs/results/gpu-2026-11-29-s24/):
#   bash scripts/gpu_session24.sh probe   call1: AttnRes GPU tests (the address-table forward's alpha = exp(s - m) / l
#       has only run under the interpreter); the AttnRes backward alone at N = 2 under the sweep's settings (programs
#       per SM: 2 chosen at N = 3 and 5); KDA GPU tests (the prep kernel's norm pass refactored, with options); the
#       prep kernel's options and timing probes (no norm pass, no gate pass) at 1x8192x32; Nsight Compute on our
#       prep and scores kernels and fla's L2 norm, gate and intra-chunk kernels (stall reasons by source line).
# Part limits sum to 480 s (probe); one command may run 600.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session24.sh probe}" in
probe)
  install_fla
  attnres_tests 90
  attnres_sweep backward "the backward alone at N = 2" 50 30 2
  kda_tests 110 tests/model/test_kda_layer_backends.py
  settings="prep norm bk64,prep norm bk128,prep norm bk128 w8,prep one loop,prep one loop bk64,prep one loop s1"
  sweep_best 1x8192x32 110 "$settings,probe prep no norms,probe prep no gate,prep bk64,prep s1,prep s3"
  NCU_IMPLS="ours fla" NCU_EXTRA="--section SourceCounters" PART_TAIL=80 part "ncu: prep, scores; fla's counterparts" \
    120 bash kernels/benchmarks/ncu_kda.sh \
    "_prep_kernel|_scores2_kernel|l2norm_fwd_kernel|kda_gate_chunk_cumsum|chunk_kda_fwd_kernel_intra|inter_solve_fused|recompute_w_u_fwd"
  ;;
esac
ls -la "$OUT"
