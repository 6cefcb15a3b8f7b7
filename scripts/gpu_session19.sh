#!/usr/bin/env bash
# Prepared in session 18 for the next session's GPU calls (results: docs/results/gpu-<date>-s19/):
#   bash scripts/gpu_session19.sh solve   the KDA scores kernel's diagonal inverses reading Akk's rows from memory
#       (SOLVE_ROW_LOADS; bit-equal in the interpreter): the KDA test files on the GPU (session 18 call3 ran only 27
#       tests of the batched off-diagonal kernel before a time limit), then sweep_kda_fwd.py at 1 x 8192 x 32 and
#       4 x 4096 x 32 (with the scores kernel's launch settings again, as the batched off-diagonal dot changed its
#       registers), then bench_kda.py at 1 x 8192 x 32 with graph-replayed forwards (no
#       Nsight Compute: the one-GPU H200 kind runs under gVisor, which reads no counters).
#   bash scripts/gpu_session19.sh bench   ours vs fla at the issue's five shapes (bench_kda.py, no prelude), with each
#       forward also replayed as a CUDA graph (--graph): device time free of the host launch cost that made fla's
#       forward host-bound at 1 x 8192 x 32 and 8 x 2048 x 16 (session 18 call4).
#   bash scripts/gpu_session19.sh fused   after call1 (scores s2 0.654 vs 0.764 ms): the training forward with the L2
#       norm and gate inside the prep kernel (ChunkKDAFunction), its GPU tests (with the new bf16 Kimi-flags test),
#       the scores kernel's stages with and without row loads at two shapes, then bench_kda.py with the best one.
#   bash scripts/gpu_session19.sh prep   after call2 (row loads at 3 stages the default, the masked-reduction form removed,
#       QS a constexpr): the KDA tests, the prep kernel's tiles and warps and the scores kernel's stages, the bench.
#   bash scripts/gpu_session19.sh prep2   the prep kernel with 32-bit offsets, and with the q, k norms from a row kernel
#       (PREP_NORM_KERNEL), then the bench.
#   bash scripts/gpu_session19.sh models   bench_backbone's training runs (hybrid, block AttnRes, full attention).
#   bash scripts/gpu_session19.sh final   the committed kernels: GPU tests and the bench at the five shapes.
# Part limits sum to 540 s (solve), 560 s (fused), 520 s (prep), 460 s (prep2), 280 s (models) and 340 s (final) (one command may run 600).
# install_fla seeds Triton's cache with fla's committed H100 tuning results (kernels/benchmarks/fla_tuning/); without
# them fla re-tunes for minutes (session 18 call3).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session19.sh solve|fused|prep|prep2|models|final|bench}" in
solve)
  install_fla
  PART_TAIL=8 part "KDA tests on the GPU (forward and backward files, all of them)" 150 python3 -m pytest -q -n 14 \
    -p no:cacheprovider -rf tests/kernels/test_kda_triton.py tests/kernels/test_kda_bwd.py
  for shape in 1x8192x32:200 4x4096x32:80; do  # shape:limit_s (the second shape reuses the compiled kernels)
    limit=${shape#*:} shape=${shape%:*}
    mkdir -p "$OUT/$shape"
    PART_TAIL=30 part "sweep_kda_fwd: solve row loads, $shape" "$limit" python3 kernels/benchmarks/sweep_kda_fwd.py \
      --shape "$shape" --out "$OUT/$shape/sweep_kda_fwd.json" --only "solve rows,solve rows w8 nreg128,scores s2,\
scores w8 nreg128,wu 64"
  done
  # the one-GPU H200 kind runs under gVisor, where Nsight Compute reads no counters (KINDS.md): the graph-replayed
  # forward against fla at the first shape instead, so that this call already answers the bench question there
  PART_TAIL=20 part "bench_kda ours vs fla at 1x8192x32, with CUDA-graph forwards" 110 python3 \
    kernels/benchmarks/bench_kda.py --no-prelude --graph --impls ours,fla --deadline 90 --shapes 1x8192x32 \
    --out "$OUT/bench_kda_1x8192x32.json"
  ;;
fused)
  install_fla
  PART_TAIL=8 part "KDA tests on the GPU (forward, backward, prep, layer)" 130 python3 -m pytest -q -n 14 \
    -p no:cacheprovider -rf tests/kernels/test_kda_triton.py tests/kernels/test_kda_bwd.py tests/kernels/test_kda_prep.py \
    tests/model/test_kda_layer_backends.py
  for shape in 1x8192x32:130 4x4096x32:70; do
    limit=${shape#*:} shape=${shape%:*}
    mkdir -p "$OUT/$shape"
    PART_TAIL=12 part "sweep_kda_fwd: scores stages x solve row loads, $shape" "$limit" python3 \
      kernels/benchmarks/sweep_kda_fwd.py --shape "$shape" --out "$OUT/$shape/sweep_kda_fwd.json" \
      --best-out "$OUT/$shape/best.txt" --only "scores s2,scores s3,solve rows,solve rows s2,solve rows s3"
  done
  best=$OUT/1x8192x32/best.txt set_file=()
  [ -f "$best" ] && set_file=(--set-file "$best") && echo "best setting at 1x8192x32: $(tr '\n' ' ' <"$best")"
  PART_TAIL=40 part "bench_kda ours (1x8192x32's best setting) vs fla, with CUDA-graph forwards" 230 python3 \
    kernels/benchmarks/bench_kda.py --no-prelude --graph --impls ours,fla --deadline 200 \
    --shapes 1x8192x32,4x4096x32,8x2048x16,2x16384x16,1x32768x16 "${set_file[@]}" --out "$OUT/bench_kda.json"
  ;;
prep)
  install_fla
  PART_TAIL=8 part "KDA forward and backward tests on the GPU" 120 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_kda_triton.py tests/kernels/test_kda_bwd.py
  mkdir -p "$OUT/1x8192x32"
  PART_TAIL=16 part "sweep_kda_fwd: scores stages, prep tiles and warps, 1x8192x32" 170 python3 \
    kernels/benchmarks/sweep_kda_fwd.py --shape 1x8192x32 --out "$OUT/1x8192x32/sweep_kda_fwd.json" \
    --best-out "$OUT/1x8192x32/best.txt" \
    --only "scores s1,scores s2,scores s4,prep s1,prep s3,prep bk64,prep w8,prep bk64 w8,prep bk16"
  best=$OUT/1x8192x32/best.txt set_file=()
  [ -f "$best" ] && set_file=(--set-file "$best") && echo "best setting at 1x8192x32: $(tr '\n' ' ' <"$best")"
  PART_TAIL=40 part "bench_kda ours (1x8192x32's best setting) vs fla, with CUDA-graph forwards" 230 python3 \
    kernels/benchmarks/bench_kda.py --no-prelude --graph --impls ours,fla --deadline 200 \
    --shapes 1x8192x32,4x4096x32,8x2048x16,2x16384x16,1x32768x16 "${set_file[@]}" --out "$OUT/bench_kda.json"
  ;;
prep2)
  install_fla
  PART_TAIL=8 part "KDA forward and backward tests on the GPU" 100 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_kda_triton.py tests/kernels/test_kda_bwd.py
  mkdir -p "$OUT/1x8192x32"
  PART_TAIL=12 part "sweep_kda_fwd: the prep kernel with the norms from a row kernel, 1x8192x32" 130 python3 \
    kernels/benchmarks/sweep_kda_fwd.py --shape 1x8192x32 --out "$OUT/1x8192x32/sweep_kda_fwd.json" \
    --best-out "$OUT/1x8192x32/best.txt" \
    --only "prep norm kernel,prep norm kernel s1,prep norm kernel w2,prep w8,prep s1,scores s2"
  best=$OUT/1x8192x32/best.txt set_file=()
  [ -f "$best" ] && set_file=(--set-file "$best") && echo "best setting at 1x8192x32: $(tr '\n' ' ' <"$best")"
  PART_TAIL=40 part "bench_kda ours (1x8192x32's best setting) vs fla, with CUDA-graph forwards" 230 python3 \
    kernels/benchmarks/bench_kda.py --no-prelude --graph --impls ours,fla --deadline 200 \
    --shapes 1x8192x32,4x4096x32,8x2048x16,2x16384x16,1x32768x16 "${set_file[@]}" --out "$OUT/bench_kda.json"
  ;;
models)  # issue 5 / 6 numbers with the KDA training path of this session (the H200 kind: first run there)
  PART_TAIL=30 part "bench_backbone: training tokens/s and MFU, hybrid / block AttnRes / full attention" 280 python3 \
    -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 32768 --decode-contexts --iters 5 \
    --variants hybrid hybrid_attnres full_attn
  ;;
final)  # the committed kernels (call3's code at the default launch settings): tests, then the bench
  install_fla
  PART_TAIL=8 part "KDA tests on the GPU (forward, backward, prep, layer)" 110 python3 -m pytest -q -n 14 \
    -p no:cacheprovider -rf tests/kernels/test_kda_triton.py tests/kernels/test_kda_bwd.py tests/kernels/test_kda_prep.py \
    tests/model/test_kda_layer_backends.py
  PART_TAIL=40 part "bench_kda ours vs fla, with CUDA-graph forwards" 230 python3 kernels/benchmarks/bench_kda.py \
    --no-prelude --graph --impls ours,fla --deadline 200 --shapes 1x8192x32,4x4096x32,8x2048x16,2x16384x16,1x32768x16 \
    --out "$OUT/bench_kda.json"
  ;;
bench)
  install_fla
  PART_TAIL=40 part "bench_kda ours vs fla, with CUDA-graph forwards" 300 python3 kernels/benchmarks/bench_kda.py \
    --no-prelude --graph --impls ours,fla --deadline 240 --shapes 1x8192x32,4x4096x32,8x2048x16,2x16384x16,1x32768x16 \
    --out "$OUT/bench_kda.json"
  ;;
esac
ls -la "$OUT"
