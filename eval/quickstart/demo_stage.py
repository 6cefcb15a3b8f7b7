"""The quickstart's demo stage: one held-out scroll-through video -> HTML with the final model, scored."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_demo(checkpoint: Path, data_root: Path, out: Path, max_new_tokens: int = 160) -> dict[str, Any]:
    """Write the demo's files under ``out`` and return its overall score and the files.

    The page task needs far more training than the quickstart gives (see docs/demo.md); the stage shows
    the path end to end (decode, chunk, generate, render, score) and reports whatever score it gets.
    """
    from eval.demo import video_to_website
    from eval.demo.heldout import heldout_pages

    page = heldout_pages(str(data_root), families=("page_video",), limit=1)[0]
    out.mkdir(parents=True, exist_ok=True)
    clip = out / "input.mp4"
    clip.write_bytes(page.media)
    (out / "reference.html").write_text(page.html)
    result = video_to_website(clip, checkpoint, out, reference_html=page.html, max_new_tokens=max_new_tokens)
    return {"overall": round(float(result["scores"].get("overall", 0.0)), 4), "page": page.key,
            "files": {k: str(v) for k, v in result["files"].items()}}
