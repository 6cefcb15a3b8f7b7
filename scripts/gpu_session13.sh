#!/usr/bin/env bash
# Session 13's GPU parts, one H100 call per PART (results: docs/results/gpu-2026-11-27-s13/):
#   (absorb: ran in call1 with KVL_ATTNRES_ABSORB off / on; the switch was removed after it, see
#    docs/results/gpu-2026-11-27-s13/README.md)
#   bash scripts/gpu_session13.sh gaps DATA     issue 9: where the GPU waits in the app's own loop at batch 24
#       (profile_train_step --pipeline-steps: kernels.profiling.idle_gaps, the holes between kernels by host op)
#   bash scripts/gpu_session13.sh pinned DATA   issue 9: allocator counters over 30 app steps at batch 24, with
#       the default allocators, pinned blocks through cudaHostRegister, and expandable device segments
#   bash scripts/gpu_session13.sh loader DATA   issue 9: the host's wait for batches at batch 24, 8 and 14 workers
#   bash scripts/gpu_session13.sh long DATA     issue 9: 80 app steps at batch 24, step time and pinned blocks by 10
#   bash scripts/gpu_session13.sh gil DATA      issue 9: the app loop with the GIL switch interval at 5 and 0.5 ms
#   bash scripts/gpu_session13.sh trace DATA    issue 9: a Chrome trace of 2 app steps at batch 24 (after 30)
#   bash scripts/gpu_session13.sh mfu DATA      issue 9: the app at batch 24 for 64 steps, tokens/s and mfu after 32
#   bash scripts/gpu_session13.sh curves DATA   issue 9: 200 steps of small_pretrain at batch 16, curves as PNG
#   bash scripts/gpu_session13.sh decode        issue 6: decode overhead at 4096 context, 12 interleaved rounds
set -u
source "$(dirname "$0")/gpu_parts.sh"
export TOKENIZERS_PARALLELISM=false

gpu_header
case "${1:?usage: gpu_session13.sh gaps|pinned|loader|long|gil|trace|mfu|curves DATA|decode}" in
gaps)
  DATA=${2:?usage: gpu_session13.sh gaps DATA}
  PART_TAIL=40 part "pipeline gaps, batch 24" 280 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=24 data.num_workers=8 \
    --steps 1 --warmup 6 --module-steps 0 --pipeline-steps 6 --out "$OUT/gaps_b24"
  ;;
pinned)
  # issue 9: pinned host blocks created while training (the loader's pin thread; cudaHostAlloc holds a driver lock
  # the main thread's launches wait on) and device allocator retries, at batch 24 over 30 unprofiled steps:
  # the default allocators, then the host allocator through cudaHostRegister, then expandable device segments
  DATA=${2:?usage: gpu_session13.sh pinned DATA}
  for v in default register expandable; do
    case $v in
      default) conf="" ;;
      register) conf="pinned_use_cuda_host_register:True,pinned_num_register_threads:8" ;;
      expandable) conf="expandable_segments:True" ;;
    esac
    PART_TAIL=14 part "pipeline b24, allocator $v" 150 env ${conf:+PYTORCH_CUDA_ALLOC_CONF=$conf} \
      python3 -m kimi_vl.benchmarks.profile_train_step --config kimi_vl/configs/small_pretrain.yaml \
      data.path="$DATA" data.batch_size=24 data.num_workers=8 --steps 1 --warmup 4 --module-steps 0 \
      --pipeline-steps 30 --pipeline-profile-steps 4 --out "$OUT/pinned_$v"
  done
  ;;
loader)
  # issue 9: does the loader keep up? the app loop at batch 24 over 30 steps with 8 and 14 loader workers, the
  # host's wait in next(batches) per step (profile_train_step's data_wait_s)
  DATA=${2:?usage: gpu_session13.sh loader DATA}
  for w in 8 14; do
    PART_TAIL=16 part "pipeline b24, $w workers" 150 python3 -m kimi_vl.benchmarks.profile_train_step \
      --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=24 data.num_workers=$w \
      --steps 1 --warmup 4 --module-steps 0 --pipeline-steps 30 --pipeline-profile-steps 4 --out "$OUT/loader_w$w"
  done
  ;;
long)
  # issue 9: does the pinned pool stop growing? 80 app steps at batch 24, step time and pinned blocks by 10 steps
  DATA=${2:?usage: gpu_session13.sh long DATA}
  PART_TAIL=20 part "pipeline b24, 80 steps" 200 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=24 data.num_workers=8 \
    --steps 1 --warmup 4 --module-steps 0 --pipeline-steps 80 --pipeline-profile-steps 2 --out "$OUT/long_b24"
  ;;
gil)
  # issue 9: the main thread waiting for the GIL (the loader's pin thread holds it up to the switch interval,
  # 5 ms by default, whenever it runs Python)? the app loop at batch 24, 50 steps, switch interval 5 / 0.5 ms
  DATA=${2:?usage: gpu_session13.sh gil DATA}
  i=0
  for ms in 5 0.5 5 0.5; do
    i=$((i + 1))
    PART_TAIL=12 part "pipeline b24, GIL switch interval $ms ms (run $i)" 170 python3 -c \
      "import runpy, sys; sys.setswitchinterval($ms / 1000); runpy.run_module('kimi_vl.benchmarks.profile_train_step', run_name='__main__')" \
      --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=24 data.num_workers=8 \
      --steps 1 --warmup 4 --module-steps 0 --pipeline-steps 50 --pipeline-profile-steps 2 --out "$OUT/gil_${ms}_$i"
  done
  ;;
trace)
  # issue 9: a Chrome trace (host threads, CUDA runtime calls, kernels) of 2 app steps at batch 24 after 30, to see
  # what the host does in the GPU's idle holes (python -m kimi_vl.benchmarks.trace_holes reads it)
  DATA=${2:?usage: gpu_session13.sh trace DATA}
  PART_TAIL=12 part "pipeline b24, trace" 200 python3 -m kimi_vl.benchmarks.profile_train_step \
    --config kimi_vl/configs/small_pretrain.yaml data.path="$DATA" data.batch_size=24 data.num_workers=8 \
    --steps 1 --warmup 4 --module-steps 0 --pipeline-steps 30 --pipeline-profile-steps 2 --pipeline-trace \
    --out "$OUT/trace_b24"
  ls -la "$OUT/trace_b24"
  ;;
mfu)
  # issue 9: the app itself (kimi_vl.train, small_pretrain) at batch 24 for 64 steps: median tokens/s and mfu over
  # steps 33-64, after the pinned pool and the compiles settle
  DATA=${2:?usage: gpu_session13.sh mfu DATA}
  APP_STEPS=64 APP_OVERRIDES="data.batch_size=24" app16 b24
  python3 -c "import json, statistics as s; r=[json.loads(l) for l in open('$OUT/app64_b24_metrics.jsonl')]; \
t=[x for x in r if x['step'] > 32]; print('app64 b24 steps 33-64: median', round(s.median(x['tokens_per_s'] for x in t)), \
'tokens/s, mfu', round(s.median(x['mfu'] for x in t), 4), ', peak', round(max(x['peak_mem_gib'] for x in t), 1), 'GiB, data wait', \
round(1e3 * s.median(x['data_wait_s'] for x in t), 1), 'ms')" 2>&1 | tee -a "$LOG"
  ;;
curves)
  # issue 9: a 200-step small_pretrain run at batch 16 (the safe throughput setting), its curves as PNG
  DATA=${2:?usage: gpu_session13.sh curves DATA}
  part "small_pretrain 200 steps, batch 16" 330 python3 -m kimi_vl.train --config kimi_vl/configs/small_pretrain.yaml \
    output_dir=/tmp/runs/curves max_steps=200 data.path="$DATA" data.batch_size=16 data.num_workers=8 \
    eval_every=50 checkpoint_every=100 optim.warmup_steps=20 optim.total_steps=200
  python3 -m kimi_vl.train.plot /tmp/runs/curves --out "$OUT/small_pretrain_b16_curves.png" 2>&1 | tail -n 2
  cp /tmp/runs/curves/metrics.jsonl "$OUT/small_pretrain_b16_metrics.jsonl"
  python3 -c "import json, statistics as s; r=[json.loads(l) for l in open('$OUT/small_pretrain_b16_metrics.jsonl')]; \
t=[x for x in r if x.get('step', 0) > 32 and 'mfu' in x]; print('curves b16 steps 33-200: median', \
round(s.median(x['tokens_per_s'] for x in t)), 'tokens/s, mfu', round(s.median(x['mfu'] for x in t), 4), \
', loss', [round(x['loss'], 3) for x in r if x.get('step') in (1, 50, 100, 200) and 'loss' in x])" 2>&1 | tee -a "$LOG"
  ;;
decode)
  # issue 6: decode overhead of block AttnRes at 4096 context, 12 interleaved rounds of 48 tokens: the best rounds
  # and the median of the per-round ratios (decode timings move ~10% between rounds)
  PART_TAIL=30 part "bench_attnres decode, 12 rounds" 300 python3 -m kimi_vl.benchmarks.bench_attnres \
    --sources 4 --decode-only --rounds 12 --decode-steps 48 --budget-s 280
  ;;
esac
ls -la "$OUT"
