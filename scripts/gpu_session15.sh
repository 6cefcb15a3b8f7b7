#!/usr/bin/env bash
# Session 15's GPU parts, one H100 call per PART (results: docs/results/gpu-2026-11-27-s15/):
#   bash scripts/gpu_session15.sh decode   the CUDA-graph decode (kimi_vl.generation.GraphDecoder): its GPU tests, then
#       bench_attnres's decode overhead of block AttnRes (eager and graph-replayed, interleaved rounds, 4096 context),
#       then bench_backbone's decode tokens/s at 32K / 128K context, eager and graph-replayed (call1; call2 with the
#       kernels of 4 eager decode steps profiled and the absorbed MLA attention reading the latent cache once; call3
#       the same (its SKIP_BACKBONE had not reached the script); call4: phase 1 one program per token for decode, the
#       two-phase kernel tests, bench_mla_decode (the absorbed attention alone at 4K-128K), SKIP_BACKBONE=1 (its tests
#       ran past the part's limit: the -k filter since); call5: phase 1's query loop unrolled, the absorbed attention
#       as two matmuls, SKIP_MLA=1; call6: `python3 kernels/benchmarks/bench_two_phase.py` alone (PYTHONPATH=.);
#       call7: phase 1's rows kernel at 4 warps, TWO_PHASE=1 SKIP_MLA=1 SKIP_BACKBONE=1; call8: phase 2 at 4 warps and
#       the queries' u in three kernels, the same flags)
#   bash scripts/gpu_session15.sh pending  prepared for the next session, not run in session 15: the graph-decode
#       overhead with the norms inside the two-phase kernels (bench_attnres's attnres_block_fused_norm variant), and
#       hybrid vs all-MLA graph decode at 128K context and batch 16 (the cache's share grows with the batch)
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

gpu_header
case "${1:?usage: gpu_session15.sh decode|pending}" in
decode)
  PART_TAIL=8 part "GPU tests: static / graph decode" 150 python3 -m pytest -q -p no:cacheprovider \
    tests/model/test_static_decode.py tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py \
    -k "${TEST_FILTER:-static or graph or two_phase}"
  [ -n "${TWO_PHASE:-}" ] && PART_TAIL=50 part "bench_two_phase" 100 python3 kernels/benchmarks/bench_two_phase.py --tokens 1
  PART_TAIL=30 part "bench_attnres decode (eager + graph)" 200 python3 -m kimi_vl.benchmarks.bench_attnres \
    --decode-only --graph-decode --decode-steps 48 --rounds 4 --graph-rounds 12 --sources 2 --profile --profile-top 14
  [ -z "${SKIP_MLA:-}" ] && PART_TAIL=20 part "bench_mla_decode" 100 python3 -m kimi_vl.benchmarks.bench_mla_decode
  [ -n "${SKIP_BACKBONE:-}" ] && { ls -la "$OUT"; exit 0; }
  PART_TAIL=30 part "bench_backbone decode (eager + graph)" 200 python3 -m kimi_vl.benchmarks.bench_backbone \
    --train-seqs --decode-contexts 32768 131072 --decode-steps 64 --graph-decode --variants hybrid full_attn \
    hybrid_attnres
  ;;
pending)
  PART_TAIL=8 part "GPU tests: static / graph decode, fused norm" 150 python3 -m pytest -q -p no:cacheprovider \
    tests/model/test_static_decode.py tests/model/test_attn_res.py tests/kernels/test_attn_res_triton.py \
    -k "static or graph or two_phase or fused"
  PART_TAIL=30 part "bench_attnres decode (graph, fused norm)" 200 python3 -m kimi_vl.benchmarks.bench_attnres \
    --decode-only --graph-decode --decode-steps 48 --rounds 2 --graph-rounds 12 --sources 2 --profile --profile-top 10
  PART_TAIL=30 part "bench_backbone decode, batch 16" 300 python3 -m kimi_vl.benchmarks.bench_backbone \
    --train-seqs --decode-contexts 131072 --decode-batch 16 --decode-steps 16 --graph-decode --variants hybrid \
    full_attn
  ;;
esac
ls -la "$OUT"
