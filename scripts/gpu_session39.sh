#!/usr/bin/env bash
# Session 39's GPU calls (results: docs/results/gpu-2026-12-07-s39/):
#   bash scripts/gpu_session39.sh check   call1: the KDA GPU tests on session 38's default (the q, k norms from the
#       scores kernel, never tested on a GPU), bench_kda.py --graph ours vs fla at the issue's five shapes, the
#       cross entropy GPU tests (session 37's kernel, not yet tested on a GPU).
#   bash scripts/gpu_session39.sh pieces  call2: the forward in pieces along time (kernels/kda/pieces.py, FWD_PIECES),
#       the state pass of each piece beside the next piece's scores: its GPU test (bit-equal to one piece, CUDA graph
#       capture), then sweep_kda_fwd.py of piece counts and state widths at 1x32768x16, 2x16384x16 and 1x8192x32
#       (at e6c1cfa: its "pieces N" settings ran the state at the one-piece width, "pieces N bv16" since; every launch
#       through the JIT).
#   bash scripts/gpu_session39.sh pieces2  call3: the same test (later pieces' launches now through the compiled
#       runners), piece counts at the pieces' state width (32), and bench_kda.py --graph with the shape rule
#       (FWD_PIECES=None) against fla at the two long shapes (the pieces test's 60 s ran out: no summary line).
#   bash scripts/gpu_session39.sh final   call4: with the shape rule the default, the KDA GPU tests with the pieces
#       test, and bench_kda.py --graph ours vs fla at the five shapes.
#   bash scripts/gpu_session39.sh short2  call5: 2 pieces at 1x8192x32 against one (the rule's), CUDA graphs and fla.
#   bash scripts/gpu_session39.sh rule    call6: 1, 2, 4 pieces at 1x8192x32 and 2x16384x16 (the shape rule's
#       PIECE_MIN_CHUNKS), CUDA graphs, fla in the same call.
#   bash scripts/gpu_session39.sh five    call7: with the final shape rule, the pieces GPU test and the five shapes
#       (not run in session 39: its device time was spent).
#   (a `split` mode for unequal pieces, PIECE_WEIGHTS, was removed with them, untimed, in session 40's review)
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session39.sh check|pieces|pieces2|final|short2|rule|five}" in
check)  # (the most telling parts first: the call may end at the session's last device time)
  install_fla
  kda_tests 150
  bench_five 200
  PART_TAIL=8 part "cross entropy tests on the GPU" 90 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_cross_entropy.py tests/kernels/test_linear_cross_entropy.py tests/kernels/test_cross_entropy_compiles.py
  ;;
pieces)
  install_fla
  PART_TAIL=8 part "pieces GPU test" 60 python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_kda_pieces.py
  fwd_sweep 1x32768x16 150 "default,pieces 2,pieces 4,pieces 8,pieces 16,pieces 4 bv32,pieces 8 bv32,pieces 4 bv64,pieces 8 bv64,default again"
  fwd_sweep 2x16384x16 100 "default,pieces 2,pieces 4,pieces 8,pieces 4 bv32,pieces 4 bv64,default again"
  fwd_sweep 1x8192x32 80 "default,pieces 2,pieces 4,pieces 4 bv64,default again"
  ;;
pieces2)
  install_fla
  PART_TAIL=8 part "pieces GPU test" 60 python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_kda_pieces.py
  fwd_sweep 1x32768x16 150 "default,pieces 3,pieces 4,pieces 5,pieces 6,pieces 8,pieces 4 s2,pieces 4 bv16 s2,pieces auto,default again"
  printf 'FWD_PIECES=None\n' >"$OUT/set.txt"
  PART_TAIL=30 part "bench_kda ours (pieces by the shape rule) vs fla" 110 python3 kernels/benchmarks/bench_kda.py \
    --no-prelude --graph --impls ours,fla --deadline 90 --shapes 1x32768x16,2x16384x16 --set-file "$OUT/set.txt" \
    --out "$OUT/bench_kda.json"
  ;;
final)  # call4: the shape rule as the default (FWD_PIECES None): the KDA GPU tests, the pieces test, the five shapes
  install_fla
  kda_tests 150 tests/kernels/test_kda_pieces.py
  bench_five 200
  ;;
short2)  # call5: 2 pieces at 1x8192x32 (one piece by the rule) as CUDA graphs, against the default in the same run
  install_fla
  PART_TAIL=12 part "bench_kda default vs fla at 1x8192x32" 70 python3 kernels/benchmarks/bench_kda.py --no-prelude \
    --graph --impls ours,fla --deadline 50 --shapes 1x8192x32 --out "$OUT/bench_kda_default.json"
  printf 'FWD_PIECES=2\n' >"$OUT/set.txt"
  PART_TAIL=12 part "bench_kda 2 pieces at 1x8192x32" 60 python3 kernels/benchmarks/bench_kda.py --no-prelude \
    --graph --impls ours --deadline 40 --shapes 1x8192x32 --set-file "$OUT/set.txt" --out "$OUT/bench_kda_pieces2.json"
  ;;
rule)  # call6: 1, 2 and 4 pieces at 1x8192x32 and 2x16384x16, CUDA graphs, fla in the same call
  install_fla
  PART_TAIL=12 part "bench_kda fla" 60 python3 kernels/benchmarks/bench_kda.py --no-prelude --graph --impls fla \
    --deadline 40 --shapes 1x8192x32,2x16384x16 --out "$OUT/bench_kda_fla.json"
  for p in 1 2 4; do
    printf 'FWD_PIECES=%s\n' $p >"$OUT/set$p.txt"
    PART_TAIL=12 part "bench_kda $p pieces" 60 python3 kernels/benchmarks/bench_kda.py --no-prelude --graph \
      --impls ours --deadline 40 --shapes 1x8192x32,2x16384x16 --set-file "$OUT/set$p.txt" \
      --out "$OUT/bench_kda_pieces$p.json"
  done
  ;;
five)  # call7: the shape rule of f9496b1 (2 or 4 pieces): the pieces test and the five shapes against fla
  install_fla
  PART_TAIL=8 part "pieces GPU test" 100 python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_kda_pieces.py
  bench_five 200
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
