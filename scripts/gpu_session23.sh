#!/usr/bin/env bash
# Prepared in session 22 for the next session's GPU calls (results: docs/results/gpu-<date>-s23/):
#   bash scripts/gpu_session23.sh attnres   issue 6: the pointer-argument forward mix now writes alpha itself (the N
#       scores kept in registers until the log-sum-exp is known; the wrapper's two launches per mix for alpha are gone:
#       call3 of session 22 profiled them at 0.094 ms a hybrid step); not yet run on a GPU. AttnRes GPU tests, then the
#       small hybrid's step overhead over 6 interleaved rounds with a profiled step (session 22 call7: +5.7%).
# Part limits sum to 340 s; one command may run 600.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session23.sh attnres}" in
attnres)
  PART_TAIL=8 part "AttnRes tests on the GPU" 90 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py
  PART_TAIL=60 part "bench_attnres: the small hybrid's block-AttnRes step overhead, 6 rounds, profiled" 250 python3 \
    -m kimi_vl.benchmarks.bench_attnres --layouts hybrid --sources 3 5 --rounds 6 --hybrid-iters 4 --decode-steps 0 \
    --profile --profile-top 20 --budget-s 400
  ;;
esac
ls -la "$OUT"
