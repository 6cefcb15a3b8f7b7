"""Scroll-through video of a web page -> HTML with a trained checkpoint (same as ``kimi-vl demo video2web``).

    python scripts/video_to_website.py --video CLIP.mp4 --checkpoint RUN/final --out DIR [--reference PAGE.html]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eval.demo.cli import run_task  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_task("video2web", sys.argv[1:], "scripts/video_to_website.py"))
