"""Design2Code-style web-page metric: real browser renders, OCR-free text blocks, five scores (REFERENCE.md s. 7).

Plain use::

    from eval.web_metric import score_html
    score = score_html(reference_html, candidate_html)   # WebScore(block_match, text, ..., overall, reason)

As an RL reward: ``reward = make_reward(); reward(reference_html, candidate_html) -> float``.
As an lm-eval metric: :func:`eval.web_metric.lm_eval_hooks.process_results`.
"""

from eval.web_metric.blocks import PageAnalysis, TextBlock, analyze_page
from eval.web_metric.ciede2000 import ciede2000, rgb_delta_e, srgb_to_lab
from eval.web_metric.score import (
    COMPONENTS,
    WebMetricConfig,
    WebMetricReport,
    WebScore,
    analyze_html,
    make_reward,
    match_blocks,
    score_analyses,
    score_html,
    score_pages,
)
from eval.web_metric.visual import VISUAL_METHOD, ssim, visual_similarity

__all__ = [
    "COMPONENTS",
    "VISUAL_METHOD",
    "PageAnalysis",
    "TextBlock",
    "WebMetricConfig",
    "WebMetricReport",
    "WebScore",
    "analyze_html",
    "analyze_page",
    "ciede2000",
    "make_reward",
    "match_blocks",
    "rgb_delta_e",
    "score_analyses",
    "score_html",
    "score_pages",
    "srgb_to_lab",
    "ssim",
    "visual_similarity",
]
