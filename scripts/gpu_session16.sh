#!/usr/bin/env bash
# Session 16's GPU parts, one H100 call per PART (results: docs/results/gpu-2026-11-27-s16/):
#   bash scripts/gpu_session16.sh decode   session 15's prepared `pending` part: the fused-norm GPU tests, the
#       graph-decode overhead of block AttnRes with the input norms inside the two-phase kernels (bench_attnres's
#       attnres_block_fused_norm variant), and hybrid vs all-MLA decode at 128K context and batch 16
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

gpu_header
case "${1:?usage: gpu_session16.sh decode}" in
decode)
  PART_TAIL=8 part "GPU tests: graph decode, fused norm" 120 python3 -m pytest -q -p no:cacheprovider \
    tests/model/test_static_decode.py tests/model/test_attn_res.py tests/kernels/test_attn_res_triton.py \
    -k "${TEST_FILTER:-graph or fused}"
  PART_TAIL=30 part "bench_attnres decode (graph, fused norm)" 170 python3 -m kimi_vl.benchmarks.bench_attnres \
    --decode-only --graph-decode --decode-steps 48 --rounds 2 --graph-rounds 12 --sources 2 --profile --profile-top 10
  PART_TAIL=30 part "bench_backbone decode, batch 16" 280 python3 -m kimi_vl.benchmarks.bench_backbone \
    --train-seqs --decode-contexts 131072 --decode-batch 16 --decode-steps 16 --graph-decode --variants hybrid \
    full_attn
  ;;
esac
ls -la "$OUT"
