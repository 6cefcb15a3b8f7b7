#!/usr/bin/env bash
# Session 11's GPU checks, one H100 call per PART (run from the repo root on the GPU machine; written in session 11,
# which had no device time left, for the next session to run):
#   bash scripts/gpu_session11.sh attnres   the AttnRes kernel tests on the GPU (the new 'rows' forward layout
#       included), then bench_attnres at batch 8 x 4096 with the forward + backward configuration sweep (tile vs
#       rows forward), the train section (standard / attnres_triton / _rows / _fusenorm, all-MLA and hybrid) and
#       --profile: the kernels whose time differs between a standard and an AttnRes step (where the +11% goes)
#       and between AttnRes with and without the fused norm; decode at 4096 (the reused h buffer: +1.2% host
#       operators a token on the CPU count, kimi_vl.benchmarks.decode_ops)
#   bash scripts/gpu_session11.sh apps DATA  the app (small_pretrain, batch 16, 24 steps) with the 'tile' forward,
#       each sublayer's input norm fused into the mix (KVL_ATTNRES_FUSE_NORM) and the 'rows' forward, interleaved
#       twice (tile fuse rows tile fuse rows), then profile_train_step's unsynchronised pipeline (the app's own loop
#       for 8 steps: how busy the GPU is between the host's launches)
# Both parts ran in session 12 at commit 81d7750 (docs/results/gpu-2026-11-27-s12; the separate 'app' and 'app2'
# parts were folded into 'apps' and removed); after it the 'rows' layout became the only pointer-argument forward
# and the fused norm was removed, so KVL_ATTNRES_FWD_LAYOUT / _FUSE_NORM no longer exist.
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

gpu_header
case "${1:?usage: gpu_session11.sh attnres|apps [DATA]}" in
attnres)
  PART_TAIL=8 part "gpu tests: AttnRes kernels and model" 200 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py
  PART_TAIL=80 part "bench_attnres sweep + profile + decode" 380 python3 -m kimi_vl.benchmarks.bench_attnres \
    --sources 2 3 4 5 --bwd-sweep --profile --budget-s 200
  ;;
apps)
  DATA=${2:?usage: gpu_session11.sh apps DATA}
  export APP_STEPS=24
  base="data.batch_size=16"
  for round in a b; do
    APP_OVERRIDES="$base" app16 tile_$round KVL_ATTNRES_FUSE_NORM=0 KVL_ATTNRES_FWD_LAYOUT=tile
    APP_OVERRIDES="$base" app16 fuse_$round KVL_ATTNRES_FUSE_NORM=1 KVL_ATTNRES_FWD_LAYOUT=tile
    APP_OVERRIDES="$base" app16 rows_$round KVL_ATTNRES_FUSE_NORM=0 KVL_ATTNRES_FWD_LAYOUT=rows
  done
  for v in fuse rows tile; do app_compare tile_a ${v}_b; done
  app_compare tile_a fuse_a
  app_compare tile_a rows_a
  app_compare tile_b fuse_b
  app_compare tile_b rows_b
  summarize tile_a fuse_a rows_a tile_b fuse_b rows_b
  PART_TAIL=40 part "pipeline: app loop, batch 16" 150 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=16 data.num_workers=8 \
    --steps 2 --warmup 4 --module-steps 0 --pipeline-steps 8 --out "$OUT/pipeline_b16"
  ;;
esac
ls -la "$OUT"
