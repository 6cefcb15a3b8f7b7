# Sourced by the GPU scripts that run several parts under time limits into one log (gpu_bench_session.sh,
# gpu_profile_app.sh): sets PYTHONPATH/OUT, LOG=$OUT/all.log, and defines
#   part TITLE LIMIT_S COMMAND...   run COMMAND under `timeout LIMIT_S`, its last PART_TAIL (40) lines to the log
#   gpu_header                      the GPU, driver, torch and triton versions to the log
#   app16 NAME ENV=VALUE...         the training app (small_pretrain on $DATA, APP_STEPS steps, default 16; APP_DIR: the
#                                   code's folder, default .; APP_OVERRIDES: extra key=value) with its metrics in $OUT
#   app_compare A B                 per-step step-time ratio B/A (same batches: the data order is seeded), losses
#   summarize NAME...               24-step runs: median tokens/s and mfu of steps 9-24, peak memory, slow steps
#   app_ab A ENV_A B ENV_B          24-step runs A B A B (rounds _a, _b; ENV_*: one VAR=VALUE each), compared per round
# and install_fla: fla-core from the carried wheel in .whl/ (the KDA peer), if there is one, with its tuning cache;
# use_fla_tuning_cache: TRITON_CACHE_DIR=/tmp/tcache seeded with fla's earlier tuning results (.fla_tcache/tcache, else
# the committed $FLA_TUNING). The KDA parts: kda_tests, sweep_best, bench_five, kda_sweep (fwd_sweep, bwd_sweep: the
# KDA kernels' settings); the AttnRes parts: attnres_tests, attnres_sweep, attnres_step; backbone_profile; and
# flipped_tree (a copy of the tree at /tmp/flip with module constants edited, to run tests or the model with an
# option on); each function's arguments are on its first line.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
# fla-core 0.6.0's autotuning results on an H100 with Triton 3.6 (session 5, call7): without them fla tunes for minutes
FLA_TUNING=${FLA_TUNING:-$PWD/kernels/benchmarks/fla_tuning/h100_triton3.6_fla0.6.0.tar.gz}
mkdir -p "$OUT"
LOG=$OUT/all.log

part() {  # title limit_s command...
  local title=$1 limit=$2
  shift 2
  echo "== $title ($(date +%T), limit ${limit}s)" | tee -a "$LOG"
  # drop Python warning lines and blank lines, but keep pytest's "N passed, M warnings" summary
  timeout "$limit" "$@" 2>&1 | grep -v -i -E "^\s*$|[a-z]*warning:|warnings\.warn|_warn_once" \
    | tail -n "${PART_TAIL:-40}" | tee -a "$LOG"
}

gpu_header() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee -a "$LOG"
}

install_fla() {
  if ls .whl/fla_core-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fla_site .whl/fla_core-*.whl \
      && export PYTHONPATH=$PYTHONPATH:/tmp/fla_site
    use_fla_tuning_cache
  fi
}

use_fla_tuning_cache() {  # fla's autotuning results: .fla_tcache/tcache if carried, else the committed H100 set
  export TRITON_CACHE_DIR=/tmp/tcache
  mkdir -p "$TRITON_CACHE_DIR"
  if [ -d .fla_tcache/tcache ]; then
    cp -r .fla_tcache/tcache/. "$TRITON_CACHE_DIR"/
  elif [ -f "$FLA_TUNING" ]; then  # tar holds tcache/<hash>/<kernel>.autotune.json
    tar xzf "$FLA_TUNING" -C "$(dirname "$TRITON_CACHE_DIR")"
  fi
}

app16() {  # name, then extra env assignments (APP_DIR: the code's folder, default .; APP_STEPS: default 16)
  local name=$1 dir=${APP_DIR:-.} steps=${APP_STEPS:-16}
  shift
  (cd "$dir" && part "app$steps $name" 200 env PYTHONPATH="$PWD:/tmp/site" "$@" python3 -m kimi_vl.train \
    --config kimi_vl/configs/small_pretrain.yaml output_dir=/tmp/runs/app_$name max_steps=$steps data.path="$DATA" \
    data.num_workers=8 eval_every=1000 checkpoint_every=1000 optim.warmup_steps=2 optim.total_steps=$steps \
    ${APP_OVERRIDES:-})
  cp /tmp/runs/app_$name/metrics.jsonl "$OUT/app${steps}_${name}_metrics.jsonl" 2>/dev/null
  python3 -c "import json, statistics as s; r=[json.loads(l) for l in open('$OUT/app${steps}_${name}_metrics.jsonl')]; \
lo=$steps*3//8; t=[x['tokens_per_s'] for x in r if lo <= x['step']]; print('app$steps $name median of steps', lo, '-', \
$steps, ':', round(s.median(t)), 'tokens/s, range', round(min(t)), '-', round(max(t)))" 2>&1 | tee -a "$LOG"
}

app_compare() {  # name_a name_b: median over the steps of the later 5/8 of the per-step time ratio b/a, and losses
  python3 - "$OUT" "${APP_STEPS:-16}" "$1" "$2" <<'PY' 2>&1 | tee -a "$LOG"
import json, statistics, sys
out, steps, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
run = {n: {r["step"]: r for r in map(json.loads, open(f"{out}/app{steps}_{n}_metrics.jsonl"))} for n in (a, b)}
lo = steps * 3 // 8
ratios = [run[b][s]["step_time_s"] / run[a][s]["step_time_s"] for s in run[a] if s >= lo and s in run[b]]
print(f"app{steps} {b} / {a}: step time ratio median {statistics.median(ratios):.3f} over steps {lo}-{steps}; "
      f"mfu {statistics.median(run[a][s]['mfu'] for s in run[a] if s >= lo):.4f} -> "
      f"{statistics.median(run[b][s]['mfu'] for s in run[b] if s >= lo):.4f}")
print("  loss " + ", ".join(f"step {s}: {run[a][s]['loss']:.4f} / {run[b][s]['loss']:.4f}"
                           for s in (1, steps // 4, steps // 2, steps) if s in run[a] and s in run[b]))
PY
}

summarize() {  # run names: median tokens/s and mfu over steps 9-24, peak memory, full collections, slow steps
  python3 - "$OUT" "$@" <<'PY' 2>&1 | tee -a "$LOG"
import json, statistics, sys
for name in sys.argv[2:]:
    try:
        rows = [json.loads(line) for line in open(f"{sys.argv[1]}/app24_{name}_metrics.jsonl")]
    except OSError:
        continue
    late = [r for r in rows if r["step"] >= 9]
    slow = [(r["step"], round(r["step_time_s"], 3), round(r.get("gc_s", 0), 3)) for r in rows
            if r["step"] >= 3 and r["step_time_s"] > 1.5 * statistics.median(x["step_time_s"] for x in late)]
    print(f"{name}: tokens/s {statistics.median(r['tokens_per_s'] for r in late):.0f}, "
          f"mfu {statistics.median(r['mfu'] for r in late):.4f}, peak {max(r.get('peak_mem_gib', 0) for r in rows):.1f} GiB, "
          f"full GC in steps {[r['step'] for r in rows if 'gc_s' in r]}, slow steps (step, s, gc_s) {slow}")
PY
}

app_ab() {  # name_a env_a name_b env_b: the two settings interleaved twice at APP_OVERRIDES, compared and summarized
  local a=$1 env_a=$2 b=$3 env_b=$4 round
  export APP_STEPS=24
  for round in a b; do
    app16 "${a}_$round" "$env_a"
    app16 "${b}_$round" "$env_b"
  done
  app_compare "${a}_a" "${b}_a"
  app_compare "${a}_b" "${b}_b"
  summarize "${a}_a" "${b}_a" "${a}_b" "${b}_b"
}

# KDA kernel sessions (session 19 on): GPU tests, a sweep of kernel settings, the bench at the issue's five shapes
FIVE=1x8192x32,4x4096x32,8x2048x16,2x16384x16,1x32768x16  # the issue's shapes

kda_tests() {  # limit_s, then test files besides the KDA forward and backward files
  local limit=$1
  shift
  PART_TAIL=8 part "KDA tests on the GPU" "$limit" python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    tests/kernels/test_kda_triton.py tests/kernels/test_kda_bwd.py "$@"
}

sweep_best() {  # shape limit_s settings: sweep_kda_fwd.py of those settings and the default; the best in best.txt
  mkdir -p "$OUT/$1"
  PART_TAIL=16 part "sweep_kda_fwd at $1: $3" "$2" python3 kernels/benchmarks/sweep_kda_fwd.py --shape "$1" \
    --out "$OUT/$1/sweep_kda_fwd.json" --best-out "$OUT/$1/best.txt" --only "$3"
}

bench_five() {  # limit_s [best.txt]: bench_kda.py ours vs fla at the five shapes, forwards also as CUDA graphs
  local limit=$1 set_file=()
  if [ -n "${2:-}" ] && [ -f "$2" ]; then
    set_file=(--set-file "$2")
    echo "setting: $(tr '\n' ' ' <"$2")"
  fi
  PART_TAIL=40 part "bench_kda ours vs fla, five shapes, with CUDA-graph forwards" "$limit" python3 \
    kernels/benchmarks/bench_kda.py --no-prelude --graph --impls ours,fla --deadline $((limit - 30)) --shapes "$FIVE" \
    "${set_file[@]}" --out "$OUT/bench_kda.json"
}

attnres_tests() {  # limit_s
  PART_TAIL=8 part "AttnRes tests on the GPU" "$1" python3 -m pytest -q -n 8 -p no:cacheprovider -rf \
    tests/kernels/test_attn_res_triton.py tests/model/test_attn_res.py
}

attnres_sweep() {  # kernels title limit_s tail [sources]: bench_attnres --bwd-sweep of the kernels at N = sources
  # (default "3 5") into $OUT/sweep_<kernels>
  # shellcheck disable=SC2086 # the kernels and sources are words
  OUT=$OUT/sweep_${1// /_} PART_TAIL=$4 part "bench_attnres --bwd-sweep: $2" "$3" python3 -m kimi_vl.benchmarks.bench_attnres \
    --layouts --sources ${5:-3 5} --bwd-sweep --sweep-kernels $1 --decode-steps 0
}

attnres_step() {  # rounds limit_s tail top: the small hybrid's block-AttnRes step overhead, profiled
  PART_TAIL=$3 part "bench_attnres: the small hybrid's block-AttnRes step overhead, $1 rounds, profiled" "$2" python3 \
    -m kimi_vl.benchmarks.bench_attnres --layouts hybrid --sources 3 5 --rounds "$1" --hybrid-iters 4 --decode-steps 0 \
    --profile --profile-top "$4" --budget-s 400
}

attnres_candidate() {  # name tail top [--set NAME=VALUE ...]: the block-AttnRes step (4 rounds, profiled) under
  # bench_attnres --set constants, JSON in $OUT/name
  local name=$1 tail=$2 top=$3
  shift 3
  mkdir -p "$OUT/$name"
  OUT=$OUT/$name PART_TAIL=$tail part "block AttnRes step, $name" 150 python3 -m kimi_vl.benchmarks.bench_attnres \
    --layouts hybrid --sources 3 --rounds 4 --hybrid-iters 4 --decode-steps 0 --profile --profile-top "$top" \
    --budget-s 400 "$@"
}

flipped_tree() {  # file sed-expression...: a copy of the tree at /tmp/flip with each expression applied to the file
  rm -rf /tmp/flip && cp -r . /tmp/flip
  while [ $# -ge 2 ]; do
    sed -i "$2" "/tmp/flip/$1" && diff "$1" "/tmp/flip/$1" | tee -a "$LOG"
    shift 2
  done
}

kda_sweep() {  # fwd|bwd shape limit_s settings [gates [beta [args...]]]: sweep_kda_<fwd|bwd>.py of those settings
  # and the default (with --gates / --beta when not empty, and further args) into
  # $OUT/<fwd|bwd>_<shape>[_<gates>][_beta<beta>]
  local kind=$1 shape=$2 limit=$3 settings=$4 gates=${5:-} beta=${6:-}
  local extra=("${@:7}")
  local dir=$OUT/${kind}_$shape${gates:+_$gates}${beta:+_beta$beta}
  mkdir -p "$dir"
  PART_TAIL=16 part "sweep_kda_$kind at $shape${gates:+, --gates $gates}${beta:+ --beta $beta}: $settings" "$limit" \
    python3 "kernels/benchmarks/sweep_kda_$kind.py" --shape "$shape" ${gates:+--gates "$gates"} \
    ${beta:+--beta "$beta"} --only "$settings" --out "$dir/sweep_kda_$kind.json" "${extra[@]}"
}

bwd_sweep() {  # shape limit_s settings [gates [beta [args...]]]: kda_sweep bwd
  kda_sweep bwd "$@"
}

fwd_sweep() {  # shape limit_s settings [gates [beta [args...]]]: kda_sweep fwd
  kda_sweep fwd "$@"
}

backbone_profile() {  # limit_s: bench_backbone --profile of the small hybrid's training step at 4096 (issue 5's MFU)
  PART_TAIL=30 part "bench_backbone --profile: the small hybrid's training step" "$1" python3 \
    -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 --decode-contexts --iters 3 --profile --variants hybrid
}
