#!/usr/bin/env bash
# Session 42's GPU calls (results: docs/results/gpu-2026-12-07-s42/):
#   bash scripts/gpu_session42.sh lean    call1 (at 6eca08a, weights off by default there): the pieces GPU test;
#       sweep_kda_fwd.py --graph at 1x8192x32 and 2x16384x16, equal pieces against weighted ones (2 pieces at 3:2, 2:1,
#       3:1, 4:1; 3 pieces at 3:2:1), one process a shape with fla; scripts/pick_piece_weights.py picks each piece
#       count's best weights into $OUT/set.txt; bench_kda.py ours (with them) vs fla at the two shapes, CUDA graphs.
#   bash scripts/gpu_session42.sh split   for a later session (not run: too little device time): the same with larger
#       first pieces (2 pieces up to 8:1) and weighted 4-piece forwards at 1x32768x16, then the five shapes.
#   bash scripts/gpu_session42.sh five [set.txt]   bench_kda.py ours vs fla at the issue's five shapes, CUDA graphs.
set -u
source "$(dirname "$0")/gpu_parts.sh"

TWO="pieces 2,pieces 2 w3:1,pieces 2 w4:1,pieces 2 w5:1,pieces 2 w6:1,pieces 2 w8:1,pieces 3,pieces 3 w2:1:1"
TWO="$TWO,pieces 3 w3:2:1,pieces 3 w5:3:2,default again"
FOUR="pieces 4,pieces 4 w4:3:2:1,pieces 4 w3:3:2:1,pieces 4 w6:3:2:1,pieces 4 w4:4:3:2,pieces 3 w3:2:1"
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
