#!/usr/bin/env bash
# One GPU without Chromium (issue 12): train the `small` page -> HTML recipe for a time budget on a carried page
# dataset, then write HTML for every held-out page with the trained model (greedy, no rendering). Score what comes
# back on a machine with Chromium:  python scripts/score_web_candidates.py OUT_DIR --out docs/results/NAME
#   bash scripts/gpu_web_small.sh DATA_TGZ [SECONDS]
# DATA_TGZ: the archive of scripts/build_web_gpudata.py (one dataset folder with its tokenizer). SECONDS (default
# 540): wall budget of the whole script; every stage runs under `timeout`, so a stage cut short still leaves its
# files in $OUT: candidates.jsonl + candidates_meta.json (the generations and their reference HTML), metrics.jsonl,
# curves.png, config.yaml, train_plan.json, logs. No weights go to $OUT.
# Time plan: the generation stage gets KVL_WEB_GEN_S seconds at the end (default 30% of SECONDS, at least 90); the
# training run gets the rest. Its max_steps comes from the step time, measured by a short probe run of the same
# config (killed after KVL_WEB_PROBE_STEPS logged steps, default 10; the median of the steps after the third: the
# first ones compile kernels for new shapes), or given as KVL_WEB_STEP_S (no probe), or fixed by KVL_WEB_STEPS. If
# the run still overruns, `timeout` stops it (the app checkpoints on SIGTERM) and a zero-step resume writes the export.
# CUDA_VISIBLE_DEVICES is honoured (one process on its first visible GPU); set it empty to run on the CPU.
# Optional environment: KVL_WEB_CONFIG (run config, default kimi_vl/configs/small_web.yaml), KVL_WEB_OVERRIDES (more
# key=value for the training app), KVL_WEB_BATCH (packed rows per step, default 4), KVL_WEB_WORKERS (loader workers,
# default 6), KVL_WEB_END_S (estimated seconds of the run's final eval + checkpoint + export, default 20),
# KVL_WEB_GEN_BATCH (pages per generation batch, 50), KVL_WEB_MAX_NEW (new tokens per page, 1024; the held-out
# pages' HTML is 251-903 tokens), KVL_WEB_LIMIT (held-out pages per family), KVL_WEB_WORK (scratch, /tmp/gpu_web).
set -u
TGZ=${1:?usage: gpu_web_small.sh DATA_TGZ [SECONDS]}
BUDGET=${2:-540}
T0=$SECONDS
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out} TOKENIZERS_PARALLELISM=false
export KVL_PROGRESS=0
CONFIG=${KVL_WEB_CONFIG:-kimi_vl/configs/small_web.yaml}
GEN_S=${KVL_WEB_GEN_S:-$(( BUDGET * 3 / 10 > 90 ? BUDGET * 3 / 10 : 90 ))}
WORK=${KVL_WEB_WORK:-/tmp/gpu_web}
RUN=$WORK/run
END=$((BUDGET - 10))         # leave 10 s for the plot and the listing
TRAIN_END=$((END - GEN_S))   # seconds since start by which the training stage must be done
elapsed() { echo $((SECONDS - T0)); }
log() { echo "[gpu_web $(elapsed)s] $*" | tee -a "$OUT/stages.txt"; }

mkdir -p "$OUT"
rm -rf "$WORK" && mkdir -p "$WORK/data"
tar xzf "$TGZ" -C "$WORK/data" || { log "cannot unpack $TGZ"; exit 2; }
DATA=$(find "$WORK/data" -mindepth 1 -maxdepth 1 -type d | head -n 1)
{ echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"
  python3 -c "import torch; c = torch.cuda.is_available(); print('torch', torch.__version__, 'device',
torch.cuda.get_device_name() if c else 'cpu')"
  nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader 2>/dev/null; } | tee "$OUT/gpu.txt"
log "data $DATA, budget ${BUDGET}s: training until ${TRAIN_END}s, generation ${GEN_S}s"

TRAIN=(python3 -m kimi_vl.train --config "$CONFIG" data.path="$DATA" data.batch_size="${KVL_WEB_BATCH:-4}"
       data.num_workers="${KVL_WEB_WORKERS:-6}" checkpoint_every=0 keep_last=1)
# shellcheck disable=SC2206
EXTRA=(${KVL_WEB_OVERRIDES:-})

step_stats() {  # metrics.jsonl -> "median_step_s first_step_s steps" (median over the steps after the third)
  python3 - "$1" <<'EOF'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
t = [r["step_time_s"] for r in recs if isinstance(r.get("step_time_s"), (int, float))]
print(f"{statistics.median(t[3:] or t):.4f} {t[0]:.4f} {len(t)}" if t else "0 0 0")
EOF
}

probe() {  # short run of the same config, killed once it has logged enough steps: step time and start-up cost
  local dir=$WORK/probe want=${KVL_WEB_PROBE_STEPS:-10} limit=$(( (TRAIN_END - $(elapsed)) / 2 )) t=$SECONDS first=""
  "${TRAIN[@]}" output_dir="$dir" max_steps=100000 eval_every=0 optim.total_steps=100000 "${EXTRA[@]}" \
    > "$OUT/probe.log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t)) -lt "$limit" ]; do
    local n=0
    [ -f "$dir/metrics.jsonl" ] && n=$(grep -c step_time_s "$dir/metrics.jsonl")
    [ "$n" -ge 1 ] && [ -z "$first" ] && first=$((SECONDS - t))
    [ "$n" -ge "$want" ] && break
    sleep 1
  done
  kill -9 "$pid" 2>/dev/null  # no checkpoint or export wanted from the probe
  wait "$pid" 2>/dev/null
  [ -f "$dir/metrics.jsonl" ] || { log "probe logged no step (see probe.log)"; return 1; }
  read -r STEP_S FIRST_S N_PROBE <<< "$(step_stats "$dir/metrics.jsonl")"
  # start-up = time to the first logged step minus that step; the real run pays it again (Triton's cache is warm)
  STARTUP_S=$(python3 -c "print(max(0.0, ${first:-$limit} - $FIRST_S))")
  log "probe: $N_PROBE steps, median step ${STEP_S}s, first step ${FIRST_S}s, start-up ${STARTUP_S}s"
}

if [ -n "${KVL_WEB_STEPS:-}" ]; then
  STEPS=$KVL_WEB_STEPS
  log "max_steps fixed by KVL_WEB_STEPS: $STEPS"
else
  if [ -n "${KVL_WEB_STEP_S:-}" ]; then
    STEP_S=$KVL_WEB_STEP_S STARTUP_S=${KVL_WEB_STARTUP_S:-45}
    log "step time given: ${STEP_S}s, start-up assumed ${STARTUP_S}s"
  else
    probe || exit 3
  fi
  AVAIL=$(( TRAIN_END - $(elapsed) ))  # 5% of margin on the step time: evals, loader stalls
  STEPS=$(python3 -c "print(max(1, int(($AVAIL - $STARTUP_S - ${KVL_WEB_END_S:-20}) / max(1.05 * $STEP_S, 1e-3))))")
  log "max_steps $STEPS from step ${STEP_S}s"
fi
WARMUP=$(( STEPS >= 40 ? STEPS / 20 : (STEPS > 2 ? 2 : 0) ))  # 5%; the schedule needs total_steps > warmup
EVAL_EVERY=$(( STEPS / 5 > 1 ? STEPS / 5 : 1 ))
printf '{"max_steps": %s, "step_s": "%s", "startup_s": "%s", "budget_s": %s, "gen_s": %s, "config": "%s"}\n' \
  "$STEPS" "${STEP_S:-}" "${STARTUP_S:-}" "$BUDGET" "$GEN_S" "$CONFIG" > "$OUT/train_plan.json"

log "training: $STEPS steps, warmup $WARMUP, eval every $EVAL_EVERY"
# --foreground: SIGTERM to the app only (it finishes the step and checkpoints); signalled too, its loader workers
# would die first and the app would crash instead
LIMIT_S=$(( TRAIN_END - $(elapsed) + 20 ))
timeout --foreground -k 60 "$LIMIT_S" "${TRAIN[@]}" output_dir="$RUN" max_steps="$STEPS" resume=never \
  eval_every="$EVAL_EVERY" optim.warmup_steps="$WARMUP" optim.total_steps="$STEPS" "${EXTRA[@]}" \
  > "$OUT/train.log" 2>&1
log "training exit $?"
if [ ! -f "$RUN/final/config.json" ] && [ -f "$RUN/checkpoints/latest" ]; then
  CKPT=$RUN/checkpoints/$(cat "$RUN/checkpoints/latest")
  DONE=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['step'])" "$CKPT/trainer_state.json")
  LEFT=$(( END - $(elapsed) - 30 ))
  log "no export: resuming at step ${DONE:-?} with max_steps=${DONE:-?} to write it (${LEFT}s)"
  [ -n "${DONE:-}" ] && [ "$LEFT" -gt 10 ] && timeout --foreground -k 10 "$LEFT" "${TRAIN[@]}" output_dir="$RUN" \
    max_steps="$DONE" resume=auto optim.warmup_steps="$WARMUP" optim.total_steps="$STEPS" "${EXTRA[@]}" \
    >> "$OUT/train.log" 2>&1
fi
cp "$RUN/metrics.jsonl" "$RUN/config.yaml" "$OUT/" 2>/dev/null
tail -n 5 "$OUT/train.log"

if [ -f "$RUN/final/config.json" ]; then
  LIMIT=()
  [ -n "${KVL_WEB_LIMIT:-}" ] && LIMIT=(--limit "$KVL_WEB_LIMIT")
  LEFT=$(( END - $(elapsed) ))
  log "generation: ${LEFT}s left"
  # the deadline counts from after the imports: 20 s of slack before `timeout` for them and the last decode step
  timeout $(( LEFT + 5 )) python3 -m eval.demo.candidates generate --checkpoint "$RUN/final" --data "$DATA" \
    --out "$OUT" --batch-size "${KVL_WEB_GEN_BATCH:-50}" --max-new-tokens "${KVL_WEB_MAX_NEW:-1024}" \
    --deadline-s $(( LEFT - 15 )) --min-batch-s 20 "${LIMIT[@]}" 2>&1 | grep -v "^\s*$" | tee "$OUT/generate.log"
  log "generation exit ${PIPESTATUS[0]}"
else
  log "no export in $RUN/final: nothing to generate with"
fi
python3 -c "import sys; from kimi_vl.train.plot import main; main(sys.argv[1:])" "$RUN" --out "$OUT/curves.png" 2>&1 \
  | tail -n 1
log "done"
ls -la "$OUT"
