#!/usr/bin/env bash
# Session 30's GPU calls (results: docs/results/gpu-<date>-s30/):
#   bash scripts/gpu_session30.sh timeline   call1: where the small hybrid's training step waits for the host
#       (kimi_vl.benchmarks.step_timeline): standard and block AttnRes at 8 x 4096, plain rounds against rounds queued
#       behind a sleep kernel (the device-bound step), host and GPU time of forward and backward, the GPU's lag at each
#       layer, and one step of each under cProfile.
#   bash scripts/gpu_session30.sh gaps       call2: the same with one profiled step of each behind the sleep kernel:
#       the idle time between its kernels, by the kernel that ended each wait (call1: AttnRes's device-bound step is
#       1 ms further above its kernel sum than the standard's).
#   bash scripts/gpu_session30.sh colsum     call3: the backward's column sums by one Triton launch each
#       (kernels/colsum.py: norm gains, KDA gate and dbeta, conv weight, AttnRes query; no zero-filled partial
#       buffers; the KDA function's unused final-state gradient not zero-filled): GPU tests, bench_colsum, and the
#       small hybrid's step on this tree and on the tree before it (old/, b6ed1d6), interleaved twice.
#   bash scripts/gpu_session30.sh clocks     call4: call3 found the step's other kernels 0.4 ms slower once ~190 small
#       kernels a step were gone (kernel sum and wall time unchanged): the GPU's power draw and SM clock during the
#       small hybrid's step on this tree and the one before it (old/), interleaved twice, and during block AttnRes's
#       step (scripts/gpu_clocks.py around bench_backbone).
#   bash scripts/gpu_session30.sh bwdocc     call5: the AttnRes backward mix at 12 elements a thread (109-163
#       registers: 4 programs an SM fit, against 2 at 24) and with pass B reloading its tiles (BWD_RELOAD): the GPU
#       tests, the --bwd-sweep of the backward at N = 3 and 5, and the small hybrid's block-AttnRes step profiled under
#       the default and two candidates (bench_attnres --set), 4 rounds each.
#   bash scripts/gpu_session30.sh final      call6: the session's final tree: the five KDA shapes against fla, the small
#       hybrid's step (bench_backbone, 10 iterations, profiled) and the step timeline of standard against block AttnRes
#       (plain and device-bound rounds).
#   bash scripts/gpu_session30.sh base       call7: block AttnRes's step overhead at the base flavor (d 1536, 48
#       sublayers in blocks of 8; device-bound and plain rounds), to see how the overhead scales with width (the small
#       flavor's sits at its traffic floor).
#   bash scripts/gpu_session30.sh attnres    call8: bench_attnres with its new device-bound rounds (each round also
#       queued behind a sleep kernel): block AttnRes's step overhead on the final tree, 8 rounds.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session30.sh timeline|gaps|colsum|clocks|bwdocc|final|base|attnres}" in
timeline)
  PART_TAIL=80 part "step timeline, 8 x 4096" 300 python3 -m kimi_vl.benchmarks.step_timeline --rounds 6 --steps 4 \
    --head-start-ms 300 --cprofile 40
  ;;
gaps)
  PART_TAIL=80 part "step timeline with device gaps, 8 x 4096" 300 python3 -m kimi_vl.benchmarks.step_timeline \
    --rounds 3 --steps 4 --head-start-ms 500 --gaps 25
  ;;
colsum)
  PART_TAIL=8 part "colsum, norm, conv, KDA and AttnRes kernel tests on the GPU" 170 python3 -m pytest -q -n 8 \
    -p no:cacheprovider -rf tests/kernels/test_colsum.py tests/kernels/test_norm.py tests/kernels/test_short_conv_triton.py \
    tests/kernels/test_kda_prep.py tests/kernels/test_kda_bwd.py tests/kernels/test_kda_triton.py \
    tests/kernels/test_attn_res_triton.py
  PART_TAIL=14 part "bench_colsum" 60 python3 kernels/benchmarks/bench_colsum.py
  for round in 1 2; do
    for tree in new old; do
      dir=.; [ $tree = old ] && dir=old
      mkdir -p "$OUT/${tree}_$round"
      (cd $dir && OUT=$OUT/${tree}_$round PART_TAIL=14 part "bench_backbone, $tree tree, round $round" 100 \
        env PYTHONPATH="$PWD:/tmp/site" python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 \
        --decode-contexts --iters 10 --profile --variants hybrid)
    done
  done
  ;;
clocks)
  for round in 1 2; do
    for tree in new old; do
      dir=.; [ $tree = old ] && dir=old
      mkdir -p "$OUT/${tree}_$round"
      (cd $dir && OUT=$OUT/${tree}_$round PART_TAIL=3 part "clocks, bench_backbone, $tree tree, round $round" 100 \
        env PYTHONPATH="$PWD:/tmp/site" python3 "$OLDPWD/scripts/gpu_clocks.py" --out "$OUT/${tree}_$round/clocks" -- \
        python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 30 --variants hybrid)
    done
  done
  mkdir -p "$OUT/attnres"
  OUT=$OUT/attnres PART_TAIL=3 part "clocks, bench_backbone, block AttnRes" 100 python3 scripts/gpu_clocks.py \
    --out "$OUT/attnres/clocks" -- python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts \
    --iters 30 --variants hybrid_attnres
  ;;
bwdocc)
  PART_TAIL=6 part "AttnRes kernel tests on the GPU" 150 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/kernels/test_attnres_compiles.py
  mkdir -p "$OUT/sweep"
  OUT=$OUT/sweep PART_TAIL=30 part "bench_attnres --bwd-sweep, backward" 150 python3 -m kimi_vl.benchmarks.bench_attnres \
    --sources 3 5 --bwd-sweep --sweep-kernels backward --layouts --mix-iters 20
  for cand in default te12 reload; do
    case $cand in
      default) sets=() ;;
      te12) sets=(--set BWD_THREAD_ELEMS=12 --set BWD_PROGRAMS_PER_SM=4 --set BWD_PREFETCH=2) ;;
      reload) sets=(--set BWD_RELOAD=True --set BWD_THREAD_ELEMS=12 --set BWD_PROGRAMS_PER_SM=4 --set BWD_PREFETCH=2) ;;
    esac
    mkdir -p "$OUT/$cand"
    OUT=$OUT/$cand PART_TAIL=22 part "block AttnRes step, backward $cand" 150 python3 -m kimi_vl.benchmarks.bench_attnres \
      --layouts hybrid --sources 3 --rounds 4 --hybrid-iters 4 --decode-steps 0 --profile --profile-top 12 \
      --budget-s 400 "${sets[@]}"
  done
  ;;
final)
  install_fla
  bench_five 140
  mkdir -p "$OUT/backbone"
  OUT=$OUT/backbone PART_TAIL=14 part "bench_backbone" 100 python3 -m kimi_vl.benchmarks.bench_backbone \
    --train-seqs 4096 --decode-contexts --iters 10 --profile --variants hybrid
  PART_TAIL=12 part "step timeline, 8 x 4096" 200 python3 -m kimi_vl.benchmarks.step_timeline --rounds 6 --steps 4 \
    --head-start-ms 300
  ;;
base)
  PART_TAIL=12 part "step timeline, base flavor, 8 x 4096" 400 python3 -m kimi_vl.benchmarks.step_timeline \
    --flavor base --rounds 3 --steps 3 --head-start-ms 1500
  ;;
attnres)
  PART_TAIL=12 part "bench_attnres, plain and device-bound rounds" 250 python3 -m kimi_vl.benchmarks.bench_attnres \
    --layouts hybrid --sources 3 --rounds 8 --hybrid-iters 4 --decode-steps 0 --budget-s 400
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
