# Sourced by the GPU scripts that run several parts under time limits into one log (gpu_bench_session.sh,
# gpu_profile_app.sh): sets PYTHONPATH/OUT, LOG=$OUT/all.log, and defines
#   part TITLE LIMIT_S COMMAND...   run COMMAND under `timeout LIMIT_S`, its last PART_TAIL (40) lines to the log
#   gpu_header                      the GPU, driver, torch and triton versions to the log
# and install_fla: fla-core from the carried wheel in .whl/ (the KDA peer), if there is one;
# use_fla_tuning_cache: TRITON_CACHE_DIR=/tmp/tcache seeded with fla's earlier tuning results (.fla_tcache/tcache).
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
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
  fi
}

use_fla_tuning_cache() {
  export TRITON_CACHE_DIR=/tmp/tcache
  mkdir -p "$TRITON_CACHE_DIR"
  if [ -d .fla_tcache/tcache ]; then cp -r .fla_tcache/tcache/. "$TRITON_CACHE_DIR"/; fi
}
