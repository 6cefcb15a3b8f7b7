#!/usr/bin/env bash
# Session 37's GPU calls (results: docs/results/gpu-2026-12-07-s37/):
#   bash scripts/gpu_session37.sh head   call1: the LM head and its loss as one node (kernels.cross_entropy.
#       linear_cross_entropy, the model's return_logits=False, the training app's fused_head_loss): its GPU tests
#       (bf16 at the small model's head, the model's fused head through the compiled kernels); bench_cross_entropy.py
#       --linear (fused against F.linear + cross_entropy, with and without the in-place backward); the small hybrid's
#       profiled training step with --head fused and --head logits, interleaved twice (issue 5's MFU).
#   bash scripts/gpu_session37.sh fwdgrad   call2: the loss + gradient kernel's forms (ce_triton.FWD_GRAD_MODE: the
#       whole row in registers, the two-pass chunks one program a row, a persistent grid): their GPU tests;
#       bench_cross_entropy.py --linear --fwd-grad-sweep; the hybrid's profiled step with the fused head against the
#       logits head, interleaved (issue 5); block AttnRes's step overhead once
#       with the fused head, the training app's (issue 6).
set -u
source "$(dirname "$0")/gpu_parts.sh"

backbone_run() {  # name dir [bench_backbone args...]: the small hybrid's profiled step from the code in dir
  local name=$1 dir=$2
  shift 2
  mkdir -p "$OUT/$name"
  (cd "$dir" && OUT=$OUT/$name PYTHONPATH=$dir:/tmp/site PART_TAIL=6 part "bench_backbone --profile, $name" 120 \
    python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --variants hybrid \
    --profile --profile-top 60 "$@")
  python3 scripts/backbone_summary.py "$OUT/$name/bench_backbone.json" loss | tee -a "$LOG"
}

gpu_header
case "${1:?usage: gpu_session37.sh head|fwdgrad}" in
head)
  PART_TAIL=8 part "cross entropy and fused head GPU tests" 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_linear_cross_entropy.py tests/kernels/test_cross_entropy.py tests/model/test_fused_head.py
  PART_TAIL=8 part "bench_cross_entropy --linear" 120 python3 kernels/benchmarks/bench_cross_entropy.py --linear \
    --out "$OUT/bench_linear_ce.json"
  for round in a b; do
    backbone_run fused_$round "$PWD" --head fused
    backbone_run logits_$round "$PWD" --head logits
  done
  ;;
fwdgrad)  # (the most telling parts first: the call may end at the session's last device time)
  PART_TAIL=16 part "bench_cross_entropy --linear --fwd-grad-sweep" 180 python3 kernels/benchmarks/bench_cross_entropy.py \
    --linear --fwd-grad-sweep --out "$OUT/bench_linear_ce.json"
  backbone_run fused_a "$PWD" --head fused
  backbone_run logits_a "$PWD" --head logits
  PART_TAIL=8 part "cross entropy and fused head GPU tests" 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_linear_cross_entropy.py tests/kernels/test_cross_entropy.py tests/model/test_fused_head.py
  backbone_run fused_b "$PWD" --head fused
  backbone_run logits_b "$PWD" --head logits
  attnres_candidate attnres_a 12 10
  ;;
*)
  echo "unknown mode $1" >&2
  exit 2
  ;;
esac
