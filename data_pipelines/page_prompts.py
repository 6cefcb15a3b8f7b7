"""The instructions of the page families (``data_pipelines.web.family``), in a module of their own: the web demo
builds its prompts from them on machines that generate but do not render (no PyAV, which ``data_pipelines.web``
loads)."""

from __future__ import annotations

IMAGE_PROMPT = "Write the HTML and CSS of this web page."
VIDEO_PROMPT = "This video scrolls through a web page from top to bottom. Write the page's HTML and CSS."
INTERACTIVE_VIDEO_PROMPT = (
    "This video scrolls through a web page from top to bottom and hovers and clicks some of its elements. "
    "Write the page's HTML and CSS, with the hover and active styles."
)
