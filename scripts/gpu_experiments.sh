#!/usr/bin/env bash
# Issue 11's GPU results in one call: experiments 1-3 (vision RL, fusion, optimizer) at `small`, the three
# `kimi-vl ablate` runs side by side on one 4-GPU machine (several chains per GPU), all cut by one deadline; a run
# that was cut gets its report rebuilt with --report-only; every report (report.md, results.json, plots, curves,
# per-question scores, logs; no weights) comes back as one tar.gz per experiment in $OUT.
#
#   cd .snap && bash scripts/gpu_experiments.sh          # nvidia-h200-x4; carry .snap and .whl_eval
#   KVL_EXP_SIZE=debug bash scripts/gpu_experiments.sh   # the same script end to end on a CPU, debug-sized
#
# Needs: .gpudata/small_subset.tar.gz (or KVL_EXP_DATA), the webdataset/braceexpand/decord wheels in .whl and the
# lm-eval wheels in .whl_eval (here or one folder up; KVL_EVAL_WHEELS), installed with --no-deps into $KVL_EXP_SITE,
# and the offline eval suites as .eval_suites/small_n10.tar.gz (here or one folder up): the GPU image has no PyAV,
# which writing the video suite needs, so they are written on a machine that has it, for suite_samples 10:
#   python -m eval.tasks --out /tmp/kvl_suite_root/tasks --n 10 --preset small
#   tar czf .eval_suites/small_n10.tar.gz -C /tmp/kvl_suite_root tasks
# Optional environment:
#   KVL_EXP_SIZE        small (default) | debug (CPU: debug flavor, seq 256, 2-3 steps, one seed, 2 questions a task)
#   KVL_EXP_BUDGET_S    seconds for the whole script, installs and bundling included (default 555)
#   KVL_EXP_RESERVE_S   seconds kept after the experiments' deadline for --report-only and bundling (default 55)
#   KVL_EXP_ONLY        which experiments, e.g. "1 3" (default "1 2 3")
#   KVL_EXP1_DEVICES .. KVL_EXP3_DEVICES   GPU slots (a repeated id = chains sharing that GPU)
#   KVL_EXP1_ARGS .. KVL_EXP3_ARGS         more key=value overrides of that experiment, e.g.
#                                          'stage_overrides.pretrain=[max_steps=100,optim.total_steps=100]'
#   KVL_EXP_DATA, KVL_EXP_WORK, OUT        dataset folder, work folder, output folder
set -u
T0=$SECONDS
SIZE=${KVL_EXP_SIZE:-small}
BUDGET=${KVL_EXP_BUDGET_S:-555}
RESERVE=${KVL_EXP_RESERVE_S:-55}
ONLY=${KVL_EXP_ONLY:-1 2 3}
WORK=${KVL_EXP_WORK:-/tmp/kvl_exp}
DATA=${KVL_EXP_DATA:-/tmp/data/small_subset}
SITE=${KVL_EXP_SITE:-/tmp/site}
SUITES_DIR=$(ls -d .eval_suites ../.eval_suites 2>/dev/null | head -n 1)
SUITE_ROOT=/tmp/kvl_suite_root/tasks
export OUT=${OUT:-$WORK/out}
mkdir -p "$WORK" "$OUT"
LOG=$OUT/run.log
: >"$LOG"
say() { echo "[$(date +%T) +$((SECONDS - T0))s] $*" | tee -a "$LOG"; }

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=$WORK/hf
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}

first_dir() {  # the first existing folder among the arguments
  for d in "$@"; do [ -n "$d" ] && [ -d "$d" ] && { echo "$d"; return; }; done
}

install_wheels() {
  local data_whl eval_whl wheels=()
  data_whl=$(first_dir .whl ../.whl)
  eval_whl=$(first_dir "${KVL_EVAL_WHEELS:-}" .whl_eval ../.whl_eval)
  [ -n "$data_whl" ] && wheels+=("$data_whl"/webdataset-*.whl "$data_whl"/braceexpand-*.whl "$data_whl"/decord-*.whl)
  [ -n "$eval_whl" ] && wheels+=("$eval_whl"/*.whl)
  say "installing ${#wheels[@]} wheels into $SITE (data: ${data_whl:-none}, lm-eval: ${eval_whl:-none})"
  [ ${#wheels[@]} -gt 0 ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${wheels[@]}" 2>&1 | grep -v -i "warning" | tail -n 5 | tee -a "$LOG"
  python3 - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib, importlib.metadata as md
for name in ("torch", "transformers", "accelerate", "lm_eval", "datasets", "pyarrow", "fsspec", "huggingface_hub",
             "webdataset", "decord"):
    try:
        importlib.import_module(name)
        print(f"  {name} {md.version(name.replace('_', '-')) if name != 'decord' else 'ok'}")
    except Exception as exc:  # noqa: BLE001 - report every missing piece, then go on (training still runs)
        print(f"  {name} FAILED: {type(exc).__name__}: {exc}")
from lm_eval import evaluator  # noqa: F401 - what `python -m eval` imports first
import torch
print("  cuda devices", torch.cuda.device_count())
EOF
}

unpack_data() {
  local tar
  if [ -f "$DATA/manifest.json" ]; then
    say "data: $DATA"
  elif tar=$(ls .gpudata/small_subset.tar.gz ../.gpudata/small_subset.tar.gz 2>/dev/null | head -n 1); [ -n "$tar" ]; then
    mkdir -p "$(dirname "$DATA")"
    tar xzf "$tar" -C "$(dirname "$DATA")" && say "data: unpacked $DATA from $tar"
  else
    say "data: $DATA missing and no .gpudata/small_subset.tar.gz"
    exit 2
  fi
}

# Size switch: everything that differs between the GPU run and the CPU check goes through the harness's own
# overrides, so both run the same experiment files.
DEBUG_TRAIN="model.flavor=debug,model.vision_flavor=debug,data.seq_len=256,data.batch_size=2,data.max_patches=64"
DEBUG_TRAIN="$DEBUG_TRAIN,data.num_workers=0,max_steps=3,eval_every=3,eval_batches=1,optim.warmup_steps=1"
DEBUG_TRAIN="$DEBUG_TRAIN,optim.total_steps=3,precision=auto"
DEBUG_RL="max_steps=2,eval_every=2,data.max_patches=64,data.heldout_prompts=2,rollout.prompts_per_step=2,rollout.k=2"
DEBUG_RL="$DEBUG_RL,rollout.sampling.max_new_tokens=4,rollout.eval_sampling.max_new_tokens=4"
DEBUG_EVAL=("seeds=[0]" "eval.limit=2" "n_boot=200")

exp_file() { ls kimi_vl/configs/experiments/small/"$1"_*.yaml; }

exp_args() {  # n -> the experiment's key=value overrides, one per line
  local n=$1 extra
  echo "base_overrides=[data.path=$DATA]"
  if [ "$SIZE" = debug ]; then
    printf '%s\n' "${DEBUG_EVAL[@]}" "stage_overrides.pretrain=[$DEBUG_TRAIN]"
    [ "$n" = 1 ] && printf '%s\n' "stage_overrides.sft=[$DEBUG_TRAIN]" "stage_overrides.rl=[$DEBUG_RL]"
  fi
  extra="KVL_EXP${n}_ARGS"
  [ -n "${!extra:-}" ] && printf '%s\n' ${!extra}
}

exp_devices() {  # n -> --devices=... (GPU run only); slots are taken by the chains in order arm x seed
  [ "$SIZE" = debug ] && return
  case $1 in  # exp 1's first two chains train the shared pretrain/SFT of its two seeds: GPUs 0 and 1
    1) echo "--devices=${KVL_EXP1_DEVICES:-0,1,0,1,0,1}" ;;
    2) echo "--devices=${KVL_EXP2_DEVICES:-2,3,2,3,0,1}" ;;
    3) echo "--devices=${KVL_EXP3_DEVICES:-2,3,0,1,2,3}" ;;
  esac
}

run_experiment() {  # n deadline_s: ablate under a timeout, then --report-only if it was cut or wrote no report
  local n=$1 deadline=$2 file out args dev rc t0=$SECONDS
  file=$(exp_file "$n")
  out=$WORK/exp$n
  mapfile -t args < <(exp_args "$n")  # the overrides must come right after the file (argparse positionals)
  dev=$(exp_devices "$n")
  echo "$ kimi-vl ablate $file ${args[*]} --out $out $dev" >"$WORK/exp$n.log"
  timeout -k 10 "$deadline" python3 -m kimi_vl.cli ablate "$file" "${args[@]}" --out "$out" $dev \
    >>"$WORK/exp$n.log" 2>&1
  rc=$?
  echo "exp$n ablate rc=$rc wall=$((SECONDS - t0))s" >>"$WORK/exp$n.log"
  if [ $rc -ge 124 ] || [ ! -f "$out/report.md" ]; then  # same overrides: they decide the run keys
    echo "$ kimi-vl ablate $file --out $out --report-only" >>"$WORK/exp$n.log"
    timeout -k 5 $((RESERVE - 25)) python3 -m kimi_vl.cli ablate "$file" "${args[@]}" --out "$out" --report-only \
      >>"$WORK/exp$n.log" 2>&1
    echo "exp$n report-only rc=$? wall=$((SECONDS - t0))s" >>"$WORK/exp$n.log"
  fi
}

place_suites() {  # n: the carried offline suites into the experiment's tasks/ (the harness then skips writing them)
  local n=$1 tar dir=$WORK/exp$1
  tar=$(ls $SUITES_DIR/small_n*.tar.gz 2>/dev/null | head -n 1)
  [ -n "$tar" ] && [ ! -f "$dir/tasks/suites.json" ] || return 0
  mkdir -p "$dir"
  tar xzf "$tar" -C "$dir"
  # written under $SUITE_ROOT (lm-eval needs absolute data_files paths): point them at this copy
  grep -rl "$SUITE_ROOT" "$dir/tasks" | xargs sed -i "s#$SUITE_ROOT#$dir/tasks#g"
  say "exp$n: suites from $tar"
}

bundle() {  # n: report, curves, scores, logs; no weights, checkpoints or suite media
  local n=$1 out=$WORK/exp$n name
  name=$(basename "$(exp_file "$n")" .yaml)
  [ -d "$out" ] || return
  cp "$WORK/exp$n.log" "$out/ablate.log" 2>/dev/null
  tar czf "$OUT/exp${n}_${name}.tar.gz" -C "$WORK" --exclude=final --exclude=checkpoints --exclude=media \
    --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' "exp$n"
  {
    echo "## exp$n ($name)"
    tail -n 3 "$WORK/exp$n.log"
    echo
    cat "$out/report.md" 2>/dev/null || echo "(no report.md)"
    echo
  } >>"$OUT/summary.md"
}

timings() {  # wall time of every stage and evaluation from its marker files, and median step times
  python3 - "$WORK" <<'EOF' 2>&1 | tee -a "$OUT/summary.md"
import json, statistics, sys
from pathlib import Path
print("## timings (stage.json -> DONE mtimes; step times: medians after step 3)\n")
for exp in sorted(Path(sys.argv[1]).glob("exp[0-9]")):
    for run in sorted((exp / "runs").glob("*")):
        st, done, met = run / "stage.json", run / "DONE", run / "metrics.jsonl"
        wall = f"{done.stat().st_mtime - st.stat().st_mtime:.0f}s" if done.exists() and st.exists() else "unfinished"
        recs = [json.loads(x) for x in met.read_text().splitlines() if x.startswith("{")] if met.exists() else []
        stats = {}
        for key in ("step_time_s", "time_rollout_s", "time_update_s", "tokens_per_s"):
            vals = [r[key] for r in recs[3:] if isinstance(r.get(key), (int, float))]
            if vals:
                stats[key] = round(statistics.median(vals), 3)
        last = max((r.get("step", 0) for r in recs), default=0)
        print(f"- {exp.name}/{run.name}: {wall}, last step {last}, {stats}")
    for ev in sorted((exp / "evals").glob("*")):
        done = ev / "DONE"
        parent = exp / "runs" / ev.name / "DONE"
        wall = (f"{done.stat().st_mtime - parent.stat().st_mtime:.0f}s after its run"
                if done.exists() and parent.exists() else "unfinished")
        print(f"- {exp.name}/evals/{ev.name}: {wall}")
EOF
}

say "size=$SIZE budget=${BUDGET}s experiments: $ONLY; $(nproc) CPUs"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$LOG"
install_wheels
unpack_data
GPU_MON=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -l 15 >"$WORK/gpu_util.csv" &
  GPU_MON=$!
fi
DEADLINE=$((BUDGET - RESERVE - (SECONDS - T0)))
[ "$DEADLINE" -lt 60 ] && DEADLINE=60
say "experiments start, ${DEADLINE}s each at most"
pids=()
for n in $ONLY; do place_suites "$n"; done
for n in $ONLY; do
  run_experiment "$n" "$DEADLINE" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
[ -n "$GPU_MON" ] && kill "$GPU_MON" 2>/dev/null
for n in $ONLY; do tail -n 2 "$WORK/exp$n.log" | tee -a "$LOG"; done
: >"$OUT/summary.md"
timings
for n in $ONLY; do bundle "$n"; done
[ -f "$WORK/gpu_util.csv" ] && cp "$WORK/gpu_util.csv" "$OUT/"
say "done"
ls -la "$OUT" | tee -a "$LOG"
