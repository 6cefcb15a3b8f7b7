#!/usr/bin/env bash
# Session 35's GPU calls (results: docs/results/gpu-2026-11-30-s35/):
#   bash scripts/gpu_session35.sh micro   call1: the AttnRes mix with its sublayer's RMSNorm in one kernel, forward and
#       backward (kernels/attn_res/mix_norm_triton.py), against the mix and the norm one after the other, at the small
#       flavor's 8 x 4096 x 768 for 2-5 sources (kernels/benchmarks/bench_mix_norm.py; the fused backward also at 1 and
#       3 programs an SM and without software pipelining).
#   bash scripts/gpu_session35.sh step    call2: the training stream with each mix of up to 4 sources and its sublayer's
#       norm in one kernel each way (KVL_ATTNRES_MIX_NORM, default 1): the AttnRes GPU tests (kernel, fused, model), then
#       the small hybrid's block-AttnRes step (bench_attnres, 4 rounds, profiled) with it and without it
#       (KVL_ATTNRES_MIX_NORM=0), interleaved, three times each.
#   bash scripts/gpu_session35.sh timeline  call3: where the device-bound step's time goes with and without the fused
#       mix and norm (step_timeline: head-start rounds, host and GPU time, the idle time between one profiled step's
#       kernels behind a sleep).
#   bash scripts/gpu_session35.sh ncu       call4: Nsight Compute on the fused and separate mix and norm kernels at 3 and 5
#       sources (kernels/benchmarks/ncu_attnres.sh): why the backward kernels move ~60% of the copy bandwidth.
#   bash scripts/gpu_session35.sh final     call5: the session's final code: the AttnRes GPU tests, the bf16 training
#       stream against fp64 with and without sublayer norms (printed), the block-AttnRes step with and without the
#       fused mix and norm, interleaved, three times each.
#   bash scripts/gpu_session35.sh host      call6: one step each of the standard and block-AttnRes hybrid under cProfile
#       (step_timeline --cprofile): the host's own time by function.
#   bash scripts/gpu_session35.sh steps     call7: the head-start rounds' GPU time of each step, standard and block
#       AttnRes, with steps back to back and with a 50 ms sleep kernel between them (step_timeline --between-ms).
#   bash scripts/gpu_session35.sh embed     call8: the token embedding's deterministic Triton backward (kernels/embedding.py):
#       its GPU tests, then the small hybrid's profiled step with it and with PyTorch's (KVL_EMBEDDING_BACKEND=torch).
#   bash scripts/gpu_session35.sh check     call9: the session's last code (GradSink in kernels/attn_res/sinks.py, the
#       forward's shared mix helper): the AttnRes and embedding GPU tests.
set -u
source "$(dirname "$0")/gpu_parts.sh"

attnres_gpu_tests() {  # the AttnRes kernel, fused mix + norm and model GPU tests
  PART_TAIL=6 part "AttnRes GPU tests" 150 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/kernels/test_attn_res_mix_norm.py tests/model/test_attn_res.py
}

mixnorm_pairs() {  # the block-AttnRes step with and without the fused mix + norm, interleaved, three times each
  for round in a b c; do
    attnres_candidate mixnorm_$round 12 10
    KVL_ATTNRES_MIX_NORM=0 attnres_candidate separate_$round 12 10
  done
}

gpu_header
case "${1:?usage: gpu_session35.sh micro|step|timeline|ncu|final|host|steps|embed|check}" in
micro)
  PART_TAIL=30 part "bench_mix_norm" 240 python3 kernels/benchmarks/bench_mix_norm.py \
    --fused-set BWD_PROGRAMS_PER_SM=1 BWD_PROGRAMS_PER_SM=3 BWD_STAGES=1
  ;;
step)
  attnres_gpu_tests
  mixnorm_pairs
  ;;
timeline)
  PART_TAIL=90 part "step_timeline with gaps" 400 python3 -m kimi_vl.benchmarks.step_timeline --rounds 4 --steps 4 \
    --head-start-ms 300 --gaps 12 --variants standard attnres_block attnres_block:KVL_ATTNRES_MIX_NORM=0
  ;;
ncu)
  for n in 3 5; do
    OUT=$OUT/ncu$n PART_TAIL=80 part "ncu, $n sources" 200 bash kernels/benchmarks/ncu_attnres.sh $n
  done
  ;;
final)
  attnres_gpu_tests
  PART_TAIL=16 part "bf16 training stream against fp64 (printed)" 120 python3 -m pytest -q -s -p no:cacheprovider \
    tests/model/test_attn_res.py -k bf16_gradients_against_fp64
  mixnorm_pairs
  ;;
host)
  PART_TAIL=60 part "step_timeline --cprofile" 300 python3 -m kimi_vl.benchmarks.step_timeline --rounds 2 --steps 4 \
    --head-start-ms 300 --cprofile 25 --variants standard attnres_block
  ;;
steps)
  for between in 0 50; do
    mkdir -p "$OUT/between$between"
    OUT=$OUT/between$between PART_TAIL=12 part "step_timeline, $between ms between steps" 200 python3 -m \
      kimi_vl.benchmarks.step_timeline --rounds 3 --steps 4 --head-start-ms 300 --between-ms $between \
      --variants standard attnres_block
  done
  ;;
embed)
  PART_TAIL=4 part "embedding and model GPU tests" 90 python3 -m pytest -q -p no:cacheprovider -rf \
    tests/kernels/test_embedding.py tests/model/test_backbone_invariants.py -k "embedding or gradient"
  for backend in triton torch; do
    mkdir -p "$OUT/$backend"
    KVL_EMBEDDING_BACKEND=$backend OUT=$OUT/$backend PART_TAIL=16 part "bench_backbone --profile, embedding $backend" \
      100 python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 \
      --variants hybrid --profile --profile-top 40
    python3 scripts/backbone_summary.py "$OUT/$backend/bench_backbone.json" embedding | tee -a "$LOG"
  done
  ;;
check)
  PART_TAIL=6 part "AttnRes and embedding GPU tests" 140 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/kernels/test_attn_res_mix_norm.py tests/kernels/test_embedding.py \
    tests/model/test_attn_res.py
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
