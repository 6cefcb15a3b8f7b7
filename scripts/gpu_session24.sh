#!/usr/bin/env bash
# Session 24's GPU calls (results: docs/results/gpu-2026-11-29-s24/):
#   bash scripts/gpu_session24.sh probe   call1: AttnRes GPU tests (the address-table forward's alpha = exp(s - m) / l
#       has only run under the interpreter); the AttnRes backward alone at N = 2 under the sweep's settings (programs
#       per SM: 2 chosen at N = 3 and 5); KDA GPU tests (the prep kernel's norm pass refactored, with options); the
#       prep kernel's options and timing probes (no norm pass, no gate pass) at 1x8192x32; Nsight Compute on our
#       prep and scores kernels and fla's L2 norm, gate and intra-chunk kernels (stall reasons by source line).
#   bash scripts/gpu_session24.sh prep    call2: the prep kernel's G_last from G's last row (no column sum: 72 -> 56
#       registers), G = cumsum(g) as tensor-core dots, and their combinations with the one-loop form (call1: 0.145
#       against 0.155 ms) at two shapes; the AttnRes kernels alone under their sweeps timed round-robin (call1 timed
#       the default 0.114 ms and the same setting 0.095 later in the same sweep). The prep options it swept were
#       removed after it (G_last from G's last row became the kernel's only form), so this mode is the record of call2.
#   bash scripts/gpu_session24.sh final   call3: KDA GPU tests and the five shapes against fla with the new prep
#       kernel; the small hybrid's MFU (issue 5).
#   bash scripts/gpu_session24.sh scores  call4: the scores kernel's time placed by probes (the diagonal inverses
#       replaced by the identity; the per-tile span check left out) and the diagonal inverses as products of powers.
#       (Call4 ran products over whole 16 x 16 blocks and the probes as SCORES2_PROBE, both since replaced.)
#   bash scripts/gpu_session24.sh scores2 call5: the new defaults (diagonal inverses as products over 8 x 8 halves,
#       the tiles' spans in a pass before the scores loop): KDA GPU tests; against the substitution, per-tile
#       reductions, both (the kernel before this session) and register caps, at two shapes.
#       (The spans' pass gave NaN on the GPU and was removed after call5, with the probes.)
#   bash scripts/gpu_session24.sh final2  call6: the committed kernels (products over 8 x 8 halves, the per-tile span
#       check): KDA GPU tests and the five shapes against fla.
# Modes probe, prep, scores and scores2 name sweep settings that were removed after they ran: they are the records of
# calls 1, 2, 4 and 5 and no longer run as they did. Call7 ran bench_kda.py alone (see the results README).
# Part limits sum to 480 s (probe), 440 s (prep), 370 s (final), 200 s (scores), 330 s (scores2), 260 s (final2); one
# command may run 600.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session24.sh probe|prep|final|scores|scores2|final2}" in
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
prep)
  install_fla
  settings="prep one loop,prep last row,prep one loop last row,prep one loop last row bk16,prep one loop last row bk64"
  settings="$settings,prep one loop last row w2,prep dot2,prep dot1,prep one loop last row dot2"
  sweep_best 1x8192x32 130 "$settings,probe prep no norms,probe prep no norms last row,probe prep no norms last row dot2,default again"
  sweep_best 2x16384x16 100 "$settings,default again"
  attnres_sweep backward "the backward alone, round-robin" 70 40 "2 3 5"
  attnres_sweep "forward flush" "the forward and the flush alone, round-robin" 70 40
  ;;
final)
  install_fla
  kda_tests 110 tests/model/test_kda_layer_backends.py
  bench_five 190
  backbone_profile 70
  ;;
scores)
  install_fla
  settings="scores diag products,probe scores diag identity,probe scores no span check,probe scores both,default again"
  sweep_best 1x8192x32 100 "$settings"
  sweep_best 8x2048x16 100 "$settings"
  ;;
scores2)
  install_fla
  kda_tests 110 tests/model/test_kda_layer_backends.py
  settings="scores diag substitution,scores span per tile,scores before s24,probe scores diag identity"
  settings="$settings,probe scores no span check,scores nreg192,scores nreg255,scores s2,default again"
  sweep_best 1x8192x32 110 "$settings"
  sweep_best 2x16384x16 110 "$settings"
  ;;
final2)
  install_fla
  kda_tests 140 tests/model/test_kda_layer_backends.py
  bench_five 120
  ;;
esac
ls -la "$OUT"
