#!/usr/bin/env bash
# Session 38's GPU calls (results: docs/results/gpu-2026-12-07-s38/):
#   bash scripts/gpu_session38.sh norms   call1: the KDA forward's q, k inverse L2 norms and gate from the scores
#       kernel (chunk_triton.SCORES2_NORMS: 0 the prep kernel's first pass, as before and the default; 1 the score loop's raw tiles,
#       the scores scaled after it; 2 a first pass inside the scores kernel; SCORES2_GATE: 0 the prep kernel, 1 the
#       score loop, 2 a first pass, 3 the score loop without reading G back; with both inside, no prep kernel): sweep_kda_fwd.py of the settings at
#       1x8192x32 and four at the small hybrid's 8x4096x6 (per-kernel times, o against fp64 for each);
#       bench_cross_entropy.py --fwd-grad-sweep (session 37's target-logit read before the reductions, not yet run
#       on a GPU); the KDA forward GPU tests.
#   bash scripts/gpu_session38.sh short   call1: the same sweeps with fewer settings and the cross entropy sweep.
#   bash scripts/gpu_session38.sh final   call2: the norms in the score loop at 2 stages against the default at the
#       hybrid's 8x4096x6; bench_kda.py --graph with it against fla at 1x8192x32 and 4x4096x32 (its set-file lacked
#       SCORES2_GATE=0, the default then being 1: it timed the gate in the score loop).
#   bash scripts/gpu_session38.sh bench   call3: that bench_kda.py run with SCORES2_GATE=0.
# (Calls 1-3 ran the code of eb9a8eb: SCORES2_LAUNCH's stages applied to every form, and the SCORES2_GATE forms and
# SCORES2_NORMS = 2 existed; the review removed those after the session: check out eb9a8eb to rerun these modes.)
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session38.sh norms|short|final|bench}" in
norms)  # (the most telling parts first: the call may end at the session's last device time)
  install_fla
  fwd_sweep 1x8192x32 150 "default,scores norms gate,scores norms gate regs,scores norms gate regs s2,scores norms s2,scores norms gate first pass,default again"
  fwd_sweep 8x4096x6 80 "default,scores norms gate,scores norms gate regs,default again" init
  PART_TAIL=16 part "bench_cross_entropy --linear --fwd-grad-sweep" 80 python3 kernels/benchmarks/bench_cross_entropy.py \
    --linear --fwd-grad-sweep --out "$OUT/bench_linear_ce.json"
  PART_TAIL=8 part "KDA forward tests on the GPU" 120 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_kda_triton.py
  ;;
short)  # the same, fewer settings, for the session's last device time
  install_fla
  fwd_sweep 1x8192x32 120 "default,scores norms gate regs,scores norms s2,scores norms gate,default again"
  fwd_sweep 8x4096x6 60 "default,scores norms gate regs,scores norms s2,default again" init
  PART_TAIL=16 part "bench_cross_entropy --linear --fwd-grad-sweep" 60 python3 kernels/benchmarks/bench_cross_entropy.py \
    --linear --fwd-grad-sweep --out "$OUT/bench_linear_ce.json"
  ;;
bench)  # call3: bench_kda.py alone with the set-file call2 should have had (call2's lacked SCORES2_GATE=0)
  install_fla
  printf 'SCORES2_NORMS=1\nSCORES2_GATE=0\nSCORES2_LAUNCH=(4, 2)\n' >"$OUT/set.txt"
  PART_TAIL=30 part "bench_kda ours (norms in the score loop, gate in prep, 2 stages) vs fla" 80 python3 \
    kernels/benchmarks/bench_kda.py --no-prelude --graph --impls ours,fla --deadline 60 --shapes 1x8192x32,4x4096x32 \
    --set-file "$OUT/set.txt" --out "$OUT/bench_kda.json"
  ;;
final)  # call2: the one form call1 found faster, at the hybrid's shape and against fla with CUDA-graph forwards
  install_fla
  printf 'SCORES2_NORMS=1\nSCORES2_LAUNCH=(4, 2)\n' >"$OUT/set.txt"
  fwd_sweep 8x4096x6 70 "default,scores norms s2" init
  PART_TAIL=30 part "bench_kda ours (norms in the score loop, 2 stages) vs fla" 110 python3 \
    kernels/benchmarks/bench_kda.py --no-prelude --graph --impls ours,fla --deadline 90 --shapes 1x8192x32,4x4096x32 \
    --set-file "$OUT/set.txt" --out "$OUT/bench_kda.json"
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
