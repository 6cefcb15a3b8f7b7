"""Video -> website and screenshot -> website demos with a trained checkpoint (issue 12, REFERENCE.md section 7).

- :func:`video_to_website` / :func:`screenshot_to_website` (``pipeline.py``): generate, recover the HTML, render
  it in Chromium, score it (against a reference page when given), write the HTML, a side-by-side PNG, the scores
  and an HTML report;
- :class:`WebsiteGenerator` (``generator.py``): a loaded checkpoint with the training prompt format;
- :func:`heldout_pages` / :func:`evaluate_heldout` (``heldout.py``): the held-out page set and a scored run;
- :func:`generate_candidates` / :func:`score_candidates` (``candidates.py``): the same run in two halves, generation
  on a machine without a browser, scoring where Chromium is.

Command line: ``kimi-vl demo video2web|screenshot2web|heldout ...`` (``cli.py``), also
``scripts/video_to_website.py`` and ``scripts/screenshot_to_website.py``.
"""

from importlib import import_module
from typing import Any

# Imported on first use: the rendering half loads PyAV and the browser driver, which a machine that only
# generates (a GPU box without Chromium) may not have.
_EXPORTS = {"Generation": "generator", "WebsiteGenerator": "generator", "load_video": "generator",
            "HeldoutPage": "heldout", "evaluate_heldout": "heldout", "heldout_pages": "heldout",
            "recover_html": "outputs", "screenshot_to_website": "pipeline", "video_to_website": "pipeline",
            "generate_candidates": "candidates", "score_candidates": "candidates"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'eval.demo' has no attribute {name!r}")
    return getattr(import_module(f"eval.demo.{_EXPORTS[name]}"), name)


__all__ = sorted(_EXPORTS)
