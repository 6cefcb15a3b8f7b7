#!/usr/bin/env bash
# Session 28's GPU calls (results: docs/results/gpu-<date>-s28/), prepared at the end of session 27:
#   bash scripts/gpu_session28.sh model   call1: session 27's final defaults (the KDA backward's dH, dVnew and dY in
#       bf16, call7's launches), which its five-shape and model runs (call5) predate: the KDA GPU tests; the five
#       shapes against fla; the small hybrid's step profile twice; block AttnRes's step overhead.
#   bash scripts/gpu_session28.sh fuse    call2: the training residual add fused into the next RMSNorm
#       (KVL_FUSED_NORM) and the KDA layer's small map padded to 264 rows (SMALL_PROJ_ALIGN): their GPU tests, the
#       small map's GEMMs at 262 / 264 rows, and the small hybrid's step profile with both, without each, and again.
#   bash scripts/gpu_session28.sh check   call3: those GPU tests to the end (call2's stopped at its 150 s limit), the
#       small hybrid's step at 10 iterations with and without the fused norm (twice, interleaved; per-step times and
#       the host-device synchronisations of a step), block AttnRes's step overhead.
# (conv, conv2 and stream ran at their commits and no longer run as written: they edit conv_triton.py's constants as
# they read then, BWD_FUSED True / "ring" / "ring"; the ring kernel has since been removed and BWD_FUSED is a bool
# for the streaming kernel.)
#   bash scripts/gpu_session28.sh conv    call4: the short conv's one-kernel backward (BWD_FUSED): the short-conv and
#       KDA-layer GPU tests, bench_short_conv (both backward paths at the model's shape, the fused one's tile sweep),
#       the small hybrid's step with it, without it, and with it again.
#   bash scripts/gpu_session28.sh conv2   call5: the same after call4's compile failure at BT != BW (fixed): the GPU
#       tests, bench_short_conv's tile sweep of the fused backward, the small hybrid's step at the fastest tiles
#       and at the default, block AttnRes's step overhead.
#   bash scripts/gpu_session28.sh stream  call6: the streaming one-kernel backward (BWD_FUSED="stream") beside the
#       ring: the short-conv GPU tests with the stream on, bench_short_conv's sweep of both, the small hybrid's step
#       at the fastest of all against the ring default.
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session28.sh model|fuse|check|conv|conv2|stream}" in
model)
  install_fla
  mkdir -p "$OUT"/round_1 "$OUT"/round_2
  kda_tests 120
  bench_five 140
  for round in 1 2; do OUT=$OUT/round_$round backbone_profile 70; done
  attnres_step 8 120 30 12
  ;;
fuse)
  part "GPU tests: norm, standard stream, KDA layer" 150 python3 -m pytest -q -x tests/kernels/test_norm.py \
    tests/model/test_attn_res.py tests/model/test_kda_layer_backends.py
  part "bench_gemm_align: the small map at 262 / 264 rows" 60 python3 -m kimi_vl.benchmarks.bench_gemm_align
  mkdir -p "$OUT"/both "$OUT"/no_fused_norm "$OUT"/no_pad "$OUT"/both_again
  OUT=$OUT/both backbone_profile 70
  OUT=$OUT/no_fused_norm KVL_FUSED_NORM=0 backbone_profile 70
  flipped_tree kimi_vl/modeling/kda_layer.py 's/^SMALL_PROJ_ALIGN = 8/SMALL_PROJ_ALIGN = 1/'
  (cd /tmp/flip && OUT=$OUT/no_pad PYTHONPATH=/tmp/flip:$PYTHONPATH backbone_profile 70)
  OUT=$OUT/both_again backbone_profile 70
  ;;
check)
  PART_TAIL=12 part "GPU tests: norm, standard stream, KDA layer" 300 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_norm.py tests/model/test_attn_res.py tests/model/test_kda_layer_backends.py
  for round in 1 2; do
    for v in fused unfused; do
      mkdir -p "$OUT/${v}_$round"
      flag=1
      [ "$v" = unfused ] && flag=0
      OUT=$OUT/${v}_$round KVL_FUSED_NORM=$flag PART_TAIL=12 part "bench_backbone, KVL_FUSED_NORM=$flag, round $round" 90 \
        python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --profile \
        --variants hybrid
    done
  done
  attnres_step 8 150 30 12
  ;;
conv)
  PART_TAIL=12 part "GPU tests: short conv, KDA layer" 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_short_conv_triton.py tests/kernels/test_short_conv.py tests/model/test_kda_layer_backends.py
  PART_TAIL=30 part "bench_short_conv: both backward paths, the fused one's tiles" 150 python3 \
    kernels/benchmarks/bench_short_conv.py --no-sweep
  flipped_tree kernels/short_conv/conv_triton.py 's/^BWD_FUSED = True/BWD_FUSED = False/'
  for v in fused two_kernels fused_again; do
    mkdir -p "$OUT/$v"
    dir=.
    [ "$v" = two_kernels ] && dir=/tmp/flip
    (cd "$dir" && OUT=$OUT/$v PYTHONPATH=$PWD:$PYTHONPATH PART_TAIL=12 part "bench_backbone, $v" 90 python3 \
      -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --profile --variants hybrid)
  done
  ;;
conv2)
  PART_TAIL=12 part "GPU tests: short conv, KDA layer" 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_short_conv_triton.py tests/kernels/test_short_conv.py tests/model/test_kda_layer_backends.py
  PART_TAIL=14 part "bench_short_conv: both backward paths, the fused one's tiles" 150 python3 \
    kernels/benchmarks/bench_short_conv.py --no-sweep
  best=$(python3 -c "import json; r=min(json.load(open('$OUT/bench_short_conv.json'))['bwd_8x4096x2304']['fused'],
    key=lambda r: r['ms']); print(r['BT'], r['BD'], r['warps'], r['tiles'], sep=', ')")
  echo "fastest fused tiles: $best" | tee -a "$LOG"
  flipped_tree kernels/short_conv/conv_triton.py "s/^FUSED_BT, FUSED_BD, FUSED_WARPS, FUSED_TILES = .*/FUSED_BT, FUSED_BD, FUSED_WARPS, FUSED_TILES = $best/"
  for v in default best default_again best_again; do
    mkdir -p "$OUT/$v"
    dir=.
    case $v in best*) dir=/tmp/flip ;; esac
    (cd "$dir" && OUT=$OUT/$v PYTHONPATH=$PWD:$PYTHONPATH PART_TAIL=4 part "bench_backbone, $v" 90 python3 \
      -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --profile --variants hybrid)
  done
  attnres_step 8 150 12 8
  ;;
stream)
  flipped_tree kernels/short_conv/conv_triton.py 's/^BWD_FUSED: str | bool = "ring"/BWD_FUSED: str | bool = "stream"/'
  (cd /tmp/flip && PYTHONPATH=$PWD:$PYTHONPATH PART_TAIL=6 part "GPU tests with the stream backward" 150 python3 \
    -m pytest -q -n 8 -p no:cacheprovider -rf tests/kernels/test_short_conv_triton.py -k "fused or gpu" \
    tests/model/test_kda_layer_backends.py)
  PART_TAIL=24 part "bench_short_conv: the one-kernel backwards' sweeps" 150 python3 \
    kernels/benchmarks/bench_short_conv.py --no-sweep
  sets=$(python3 - "$OUT/bench_short_conv.json" <<'PY'
import json, sys
r = min(json.load(open(sys.argv[1]))["bwd_8x4096x2304"]["fused"], key=lambda r: r["ms"])
names, vals = ", ".join(r["names"]), ", ".join(map(str, r["config"]))
print(f's/^BWD_FUSED: str | bool = .*/BWD_FUSED: str | bool = "{r["kind"]}"/;s/^{names} = .*/{names} = {vals}/')
PY
)
  echo "fastest one-kernel backward: $sets" | tee -a "$LOG"
  flipped_tree kernels/short_conv/conv_triton.py "$sets"
  for v in ring best; do
    mkdir -p "$OUT/$v"
    dir=.
    case $v in best*) dir=/tmp/flip ;; esac
    (cd "$dir" && OUT=$OUT/$v PYTHONPATH=$PWD:$PYTHONPATH PART_TAIL=3 part "bench_backbone, $v" 90 python3 \
      -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 10 --profile --variants hybrid)
  done
  ;;
esac
ls -la "$OUT"
