#!/usr/bin/env bash
# Prepared in session 22 for the next session's GPU calls (results: docs/results/gpu-<date>-s23/):
#   bash scripts/gpu_session23.sh attnres   issue 6: the pointer-argument forward mix now writes alpha itself (the N
#       scores kept in registers until the log-sum-exp is known; the wrapper's two launches per mix for alpha are gone:
#       call3 of session 22 profiled them at 0.094 ms a hybrid step); not yet run on a GPU. AttnRes GPU tests, then the
#       small hybrid's step overhead over 6 interleaved rounds with a profiled step (session 22 call7: +5.7%).
#   bash scripts/gpu_session23.sh order     call2: AttnRes GPU tests with alpha = exp(s - m) / l (call1: exp(s - lse)
#       failed the N = 1 test: dweight 1.1e-5 where it is 0); the KDA forward with its per-(chunk, head) kernels' grids
#       heads first (PREP_ / SCORES2_ / OUT_HEADS_FIRST) at two shapes; the AttnRes backward with 2 / 4 / 8 programs
#       per SM (fewer rows for the query-gradient sum), kernels alone and as the hybrid step's profile.
#   bash scripts/gpu_session23.sh final     call3: KDA GPU tests and the five-shape benchmark against fla with the grids
#       heads first (the new default); AttnRes GPU tests with 2 backward programs per SM and the query gradient summed
#       by _colsum_kernel (ATen's sum took 8-15 us a mix in call2's profiles); the backward alone under the sweep's
#       configurations; the small hybrid's step overhead, 6 rounds, profiled; the small hybrid's MFU (issue 5).
#   bash scripts/gpu_session23.sh flush     call4: AttnRes GPU tests; the flush kernel alone with a grid-stride option
#       (FLUSH_PROGRAMS_PER_SM 2 / 4 / 8; it compiles to 255 registers with spills from N = 3); the query-gradient sum
#       with 24 programs (64 x 32 blocks; call3: 6.5 us a call at 12); the small hybrid's step overhead, 8 rounds,
#       profiled.
#   bash scripts/gpu_session23.sh last      call5: the committed state (grid-stride flush removed, alpha's gradient no
#       longer zero-filled): AttnRes GPU tests; the small hybrid's step overhead, 8 rounds, profiled.
#   bash scripts/gpu_session23.sh unroll    call6: the prep kernel's K loops as straight-line code (PREP_UNROLL, the new
#       default; 80 registers against 88) against the loops ("prep rolled") at two shapes, with o's difference and its
#       error against fp64; the five shapes against fla with the new default. The unrolled loops were slower (prep
#       0.193 against 0.154 ms) and PREP_UNROLL was removed after this call, so this mode no longer runs.
# Part limits sum to 340 s (attnres), 560 s (order), 645 s (final: the parts took 85-90 s or less in session 22),
# 320 s (flush), 270 s (last) and 290 s (unroll); one command may run 600.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session23.sh attnres|order|final|flush|last|unroll}" in
attnres)
  attnres_tests 90
  attnres_step 6 250 60 20
  ;;
order)
  install_fla
  attnres_tests 90
  settings="prep heads first,scores heads first,output heads first,all heads first"
  sweep_best 1x8192x32 80 "$settings"
  sweep_best 8x2048x16 80 "$settings"
  attnres_sweep backward "backward programs per SM" 60 30
  for ppsm in 8 4; do
    OUT=$OUT/ppsm$ppsm PART_TAIL=12 part "bench_attnres: hybrid step, BWD_PROGRAMS_PER_SM=$ppsm, profiled" 120 \
      python3 -m kimi_vl.benchmarks.bench_attnres --layouts hybrid --sources 3 --rounds 3 --hybrid-iters 4 \
      --decode-steps 0 --profile --profile-top 8 --budget-s 400 --set BWD_PROGRAMS_PER_SM=$ppsm
  done
  ;;
final)
  install_fla
  kda_tests 110 tests/model/test_kda_layer_backends.py
  bench_five 190
  attnres_tests 85
  attnres_sweep backward "the backward alone" 50 30
  attnres_step 6 150 40 12
  backbone_profile 60
  ;;
flush)
  attnres_tests 85
  attnres_sweep flush "the flush alone" 50 24
  attnres_step 8 185 40 12
  ;;
last)
  attnres_tests 85
  attnres_step 8 185 40 12
  ;;
unroll)
  install_fla
  sweep_best 1x8192x32 70 "prep rolled"
  sweep_best 8x2048x16 70 "prep rolled"
  bench_five 150
  ;;
esac
ls -la "$OUT"
