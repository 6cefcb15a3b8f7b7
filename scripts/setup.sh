#!/usr/bin/env bash
# Create (or update) the project's virtual environment.
#
#   scripts/setup.sh            -> .venv with the project (editable) and its dev tools
#
# On a machine without an NVIDIA GPU, every install goes through requirements/constraints-cpu.txt,
# which pins the local CPU torch wheel (otherwise timm -> torchvision drags in a newer torch with
# several GB of CUDA wheels), and a small import hook is installed that makes PyPI's CUDA-linked
# torchvision importable on CPU torch (see scripts/torchvision_cpu_fix.py). On a GPU machine pip
# resolves a CUDA torch normally and the hook is not installed.
#
# It also installs Debian's Chromium (scripts/install_chromium.sh) for page rendering and the
# Design2Code metric, unless KVL_NO_BROWSER=1 or KVL_CHROMIUM points at another browser.
#
# Environment: KVL_VENV (default .venv), PYTHON (default python3), KVL_EXTRAS (default dev).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${KVL_VENV:-.venv}
PY=${PYTHON:-python3}
EXTRAS=${KVL_EXTRAS:-dev}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  CONSTRAINTS=requirements/constraints-gpu.txt
else
  CONSTRAINTS=requirements/constraints-cpu.txt
fi

if [ "${KVL_NO_BROWSER:-0}" != "1" ] && [ -z "${KVL_CHROMIUM:-}" ]; then
  bash scripts/install_chromium.sh >/dev/null || echo "[setup] Chromium not installed: web rendering tests will fail (see scripts/install_chromium.sh)" >&2
fi

# Skip the pip run when nothing that decides the environment changed since the last success.
stamp="$VENV/.kvl-setup-stamp"
want=$(cat pyproject.toml "$CONSTRAINTS" scripts/setup.sh scripts/torchvision_cpu_fix.py scripts/install_chromium.sh | sha256sum | cut -c1-16)-$EXTRAS
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip setuptools wheel -c "$CONSTRAINTS"
echo "[setup] installing the project into $VENV with $CONSTRAINTS (first time: a few minutes)"
"$VPY" -m pip install -q -c "$CONSTRAINTS" -e ".[$EXTRAS]"

# The torchvision hook: only for a CPU-only torch, only inside this venv.
site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if "$VPY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda is None and torch.version.hip is None else 1)'; then
  cp scripts/torchvision_cpu_fix.py "$site/_kvl_torchvision_cpu_fix.py"
  echo "import _kvl_torchvision_cpu_fix" > "$site/kvl_torchvision_cpu_fix.pth"
else
  rm -f "$site/_kvl_torchvision_cpu_fix.py" "$site/kvl_torchvision_cpu_fix.pth"
fi

"$VPY" - <<'PY'
import importlib
for mod in ("torch", "timm", "torchvision.transforms.v2", "transformers", "accelerate", "lm_eval", "webdataset"):
    importlib.import_module(mod)
print("[setup] environment OK")
PY
echo "$want" > "$stamp"
