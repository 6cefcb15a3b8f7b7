#!/usr/bin/env bash
# Prepared in session 20 for the next session's GPU calls (results: docs/results/gpu-<date>-s21/):
#   bash scripts/gpu_session21.sh attnres   issue 6: the block-AttnRes training-step overhead with the mix kernels
#       loading every source tile ahead (FWD_PREFETCH = BWD_PREFETCH = 8, the default since session 20 call8, which
#       timed the kernels alone: forward -18%, backward -7% at N = 4), interleaved rounds against the standard
#       residual; the mix kernels alone (--bwd-sweep, incl. the flush kernel's new FLUSH_PREFETCH, off by default:
#       188-194 registers against 146-160, no spills: `ptxas_regs.py --attnres [--set FLUSH_PREFETCH=8]`); then the
#       AttnRes GPU tests. The deferring backward spills more with every tile ahead from N = 6 on (112 B against 40 at
#       N = 6), which only the step time shows; `--set BWD_PREFETCH=...` in the sweep is the non-deferring kernel.
#   bash scripts/gpu_session21.sh kda       issue 4: the KDA GPU tests (first GPU run of the fp32 suffix-sum path,
#       FP32_KG_SUFFIX, and of the split prep kernel), a sweep of the prep kernel split over programs (PREP_SPLIT:
#       program 0 the norms, one program per key tile of gate / cumsum; 80 registers against 94, 47 at 16 columns),
#       and of the scores kernel's off-diagonal blocks per sub-block (SCORES2_OFFDIAG = "blocks": 64 B of spills at
#       168 registers against 372), then the five shapes against fla-core with the sweep's best setting.
#   bash scripts/gpu_session21.sh profile   issue 5: where a `small` hybrid training step's GPU time goes on this GPU
#       (bench_backbone --profile at 4096: time by kernel category and the top kernels), hybrid and all-MLA.
# Part limits sum to 440 s (attnres), 450 s (kda) and 200 s (profile); one command may run 600.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session21.sh attnres|kda|profile}" in
attnres)
  PART_TAIL=40 part "bench_attnres: block AttnRes training-step overhead, interleaved rounds" 200 python3 \
    -m kimi_vl.benchmarks.bench_attnres --sources 2 4 6 --rounds 3 --iters 3 --hybrid-iters 4 --decode-steps 0 \
    --budget-s 400
  PART_TAIL=60 part "bench_attnres --bwd-sweep: mix and flush kernel constants" 120 python3 \
    -m kimi_vl.benchmarks.bench_attnres --sources 3 5 --bwd-sweep --rounds 1 --iters 1 --hybrid-iters 1 \
    --decode-steps 0 --no-hybrid
  PART_TAIL=8 part "AttnRes tests on the GPU" 120 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py
  ;;
kda)
  install_fla
  kda_tests 110 tests/model/test_kda_layer_backends.py
  sweep_best 1x8192x32 150 "prep split,prep split bk16,prep split bk64,prep split w2,scores blocks,\
scores blocks nreg192,scores blocks s2,scores blocks prep split"
  bench_five 190 "$OUT/1x8192x32/best.txt"
  ;;
profile)
  PART_TAIL=80 part "bench_backbone --profile: a small training step by kernel" 200 python3 \
    -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 3 --profile \
    --variants hybrid full_attn
  ;;
esac
ls -la "$OUT"
