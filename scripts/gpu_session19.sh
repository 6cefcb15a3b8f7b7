#!/usr/bin/env bash
# Session 19's GPU calls (prepared in session 18, extended during 19; results: docs/results/gpu-2026-11-28-s19/):
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
#   bash scripts/gpu_session19.sh prep   after call2 (row loads at 3 stages the default, the masked-reduction form
#       removed, QS a constexpr): the KDA tests, the prep kernel's tiles and warps and the scores kernel's stages, the
#       bench.
#   bash scripts/gpu_session19.sh prep2   the prep kernel with 32-bit offsets, and with the q, k norms from a row kernel
#       (PREP_NORM_KERNEL), then the bench.
#   bash scripts/gpu_session19.sh models   bench_backbone's training runs (hybrid, block AttnRes, full attention).
#   bash scripts/gpu_session19.sh final   the committed kernels: GPU tests and the bench at the five shapes.
#   bash scripts/gpu_session19.sh prelude   bench_kda.py's ceilings, errors against fp64 and decode on this GPU.
# Part limits sum to 540 s (solve), 560 s (fused), 520 s (prep), 460 s (prep2), 280 s (models) and 340 s (final); one
# command may run 600. The sweep settings named by solve, fused and prep2 (row-load solve, norm row kernel) were
# removed after the session measured them: those modes now sweep only what is left; final and models rerun as is.
# install_fla seeds Triton's cache with fla's committed H100 tuning results (kernels/benchmarks/fla_tuning/); without
# them fla re-tunes for minutes (session 18 call3).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session19.sh solve|fused|prep|prep2|models|final|prelude|bench}" in
solve)
  install_fla
  kda_tests 150
  sweep_best 1x8192x32 200 "solve rows,solve rows w8 nreg128,scores s2,scores w8 nreg128,wu 64"
  sweep_best 4x4096x32 80 "solve rows,solve rows w8 nreg128,scores s2,scores w8 nreg128,wu 64"
  # the one-GPU H200 kind runs under gVisor, where Nsight Compute reads no counters (KINDS.md): the graph-replayed
  # forward against fla at the first shape instead, so that this call already answers the bench question there
  PART_TAIL=20 part "bench_kda ours vs fla at 1x8192x32, with CUDA-graph forwards" 110 python3 \
    kernels/benchmarks/bench_kda.py --no-prelude --graph --impls ours,fla --deadline 90 --shapes 1x8192x32 \
    --out "$OUT/bench_kda_1x8192x32.json"
  ;;
fused)
  install_fla
  kda_tests 130 tests/kernels/test_kda_prep.py tests/model/test_kda_layer_backends.py
  sweep_best 1x8192x32 130 "scores s2,scores s3,solve rows,solve rows s2,solve rows s3"
  sweep_best 4x4096x32 70 "scores s2,scores s3,solve rows,solve rows s2,solve rows s3"
  bench_five 230 "$OUT/1x8192x32/best.txt"
  ;;
prep)
  install_fla
  kda_tests 120
  sweep_best 1x8192x32 170 "scores s1,scores s2,scores s4,prep s1,prep s3,prep bk64,prep w8,prep bk64 w8,prep bk16"
  bench_five 230 "$OUT/1x8192x32/best.txt"
  ;;
prep2)
  install_fla
  kda_tests 100
  sweep_best 1x8192x32 130 "prep norm kernel,prep norm kernel s1,prep norm kernel w2,prep w8,prep s1,scores s2"
  bench_five 230 "$OUT/1x8192x32/best.txt"
  ;;
models)  # issue 5 / 6 numbers with the KDA training path of this session (the H200 kind: first run there)
  PART_TAIL=30 part "bench_backbone: training tokens/s and MFU, hybrid / block AttnRes / full attention" 280 python3 \
    -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 32768 --decode-contexts --iters 5 \
    --variants hybrid hybrid_attnres full_attn
  ;;
final)  # the committed kernels (call3's code at the default launch settings): tests, then the bench
  install_fla
  kda_tests 110 tests/kernels/test_kda_prep.py tests/model/test_kda_layer_backends.py
  bench_five 230
  ;;
prelude)  # bench_kda.py's prelude alone on this GPU: copy / matmul ceilings, errors vs fp64, decode at B 64, H 32
  install_fla
  PART_TAIL=12 part "bench_kda prelude (no shapes: deadline 0)" 130 python3 kernels/benchmarks/bench_kda.py \
    --impls ours,fla --deadline 0 --shapes 1x8192x32 --out "$OUT/bench_kda_prelude.json"
  ;;
bench)
  install_fla
  bench_five 300
  ;;
esac
ls -la "$OUT"
