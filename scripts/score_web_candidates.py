"""Score held-out page candidates generated on a machine without a browser (``scripts/gpu_web_small.sh``).

    python scripts/score_web_candidates.py CANDIDATES_DIR --out docs/results/NAME
        [--data runs/gpudata_web/web_small_r] [--pages-dir DIR] [--examples 2] [--n-boot 2000]

CANDIDATES_DIR holds ``candidates.jsonl`` (the device call's ``$OUT``); ``--data`` is the dataset they were generated
from (default: the folder ``scripts/build_web_gpudata.py`` writes; or unpack its archive there:
``mkdir -p runs/gpudata_web && tar xzf .gpudata_web/web_small_r.tar.gz -C runs/gpudata_web``). Same as
``python -m eval.demo.candidates score`` (the files it writes are listed there): per-page scores, means with 95%
bootstrap intervals, side-by-side PNGs.
"""

import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eval.demo.candidates import main  # noqa: E402

DEFAULT_DATA = "runs/gpudata_web/web_small_r"

if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv and argv[0] not in ("-h", "--help") and "--data" not in argv:
        argv += ["--data", DEFAULT_DATA]
    command = shlex.join(["python", "scripts/score_web_candidates.py", *argv])
    sys.exit(main(["score", *argv], command))
