"""Video -> website and screenshot -> website demos with a trained checkpoint (issue 12, REFERENCE.md section 7).

- :func:`video_to_website` / :func:`screenshot_to_website` (``pipeline.py``): generate, recover the HTML, render
  it in Chromium, score it (against a reference page when given), write the HTML, a side-by-side PNG, the scores
  and an HTML report;
- :class:`WebsiteGenerator` (``generator.py``): a loaded checkpoint with the training prompt format;
- :func:`heldout_pages` / :func:`evaluate_heldout` (``heldout.py``): the held-out page set and a scored run.

Command line: ``kimi-vl demo video2web|screenshot2web|heldout ...`` (``cli.py``), also
``scripts/video_to_website.py`` and ``scripts/screenshot_to_website.py``.
"""

from eval.demo.generator import Generation, WebsiteGenerator, load_video
from eval.demo.heldout import HeldoutPage, evaluate_heldout, heldout_pages
from eval.demo.outputs import recover_html
from eval.demo.pipeline import screenshot_to_website, video_to_website

__all__ = ["Generation", "HeldoutPage", "WebsiteGenerator", "evaluate_heldout", "heldout_pages", "load_video",
           "recover_html", "screenshot_to_website", "video_to_website"]
