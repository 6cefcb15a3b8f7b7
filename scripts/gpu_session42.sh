#!/usr/bin/env bash
# Session 42's GPU calls (results: docs/results/gpu-2026-12-07-s42/):
#   bash scripts/gpu_session42.sh split   unequal pieces (pieces.PIECE_WEIGHTS, larger early ones) against the shape
#       rule's equal pieces, one process a shape (sweep_kda_fwd.py --graph, fla in the same process) at the three
#       shapes the rule cuts; the pieces GPU test first.
#       Then scripts/pick_piece_weights.py picks each piece count's best weights (against equal pieces, same process)
#       into $OUT/set.txt and bench_kda.py runs ours with them vs fla at the issue's five shapes (CUDA graphs).
#   bash scripts/gpu_session42.sh lean    the same at the two 2-piece shapes with fewer weights, then bench_kda.py
#       ours (picked weights) vs fla at those two shapes (for a call with little device time left).
#   bash scripts/gpu_session42.sh five [set.txt]   bench_kda.py ours vs fla at the issue's five shapes, CUDA graphs.
set -u
source "$(dirname "$0")/gpu_parts.sh"

TWO="pieces 2,pieces 2 w3:2,pieces 2 w2:1,pieces 2 w7:3,pieces 2 w3:1,pieces 3,pieces 3 w2:1:1,pieces 3 w3:2:1"
TWO="$TWO,pieces 3 w5:3:2,default again"
FOUR="pieces 4,pieces 4 w4:3:2:1,pieces 4 w3:3:2:1,pieces 4 w2:2:1:1,pieces 4 w4:4:3:2,pieces 3 w3:2:1"
FOUR="$FOUR,pieces 3 w5:3:2,default again"

gpu_header
case "${1:?usage: gpu_session42.sh split|lean|five [set.txt]}" in
split)
  install_fla
  PART_TAIL=8 part "pieces GPU test" 100 python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_kda_pieces.py
  fwd_sweep 1x8192x32 120 "$TWO" "" "" --graph
  fwd_sweep 2x16384x16 120 "$TWO" "" "" --graph
  fwd_sweep 1x32768x16 120 "$FOUR" "" "" --graph
  python3 scripts/pick_piece_weights.py "$OUT"/fwd_*/sweep_kda_fwd.json --out "$OUT/set.txt" | tee -a "$LOG"
  bench_five 200 "$OUT/set.txt"
  ;;
lean)
  install_fla
  PART_TAIL=8 part "pieces GPU test" 100 python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_kda_pieces.py
  lean="pieces 2,pieces 2 w3:2,pieces 2 w2:1,pieces 2 w3:1,pieces 2 w4:1,pieces 3 w3:2:1,default again"
  fwd_sweep 1x8192x32 90 "$lean" "" "" --graph
  fwd_sweep 2x16384x16 90 "$lean" "" "" --graph
  python3 scripts/pick_piece_weights.py "$OUT"/fwd_*/sweep_kda_fwd.json --out "$OUT/set.txt" | tee -a "$LOG"
  PART_TAIL=20 part "bench_kda ours (picked weights) vs fla" 90 python3 kernels/benchmarks/bench_kda.py --no-prelude \
    --graph --impls ours,fla --deadline 70 --shapes 1x8192x32,2x16384x16 --set-file "$OUT/set.txt" \
    --out "$OUT/bench_kda.json"
  ;;
five)
  install_fla
  bench_five 200 "${2:-}"
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
