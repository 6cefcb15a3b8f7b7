"""Full-page screenshot of a web page -> HTML with a trained checkpoint (same as ``kimi-vl demo screenshot2web``).

    python scripts/screenshot_to_website.py --image PAGE.png --checkpoint RUN/final --out DIR [--reference PAGE.html]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eval.demo.cli import run_task  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_task("screenshot2web", sys.argv[1:], "scripts/screenshot_to_website.py"))
