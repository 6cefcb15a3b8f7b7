"""Hooks that turn the web metric into an lm-eval metric (lm-eval 0.4 ``process_results`` contract).

A generate-until task whose documents carry the reference page in ``doc["html"]`` uses it as::

    process_results: !function web_metric_hooks.process_results   # a one-line module re-exporting this
    metric_list:
      - {metric: design2code, aggregation: mean, higher_is_better: true}
      - {metric: d2c_block_match, aggregation: mean, higher_is_better: true}
      ...

lm-eval calls ``process_results(doc, results)`` with the model's generations; the returned numbers are averaged
by the ``mean`` aggregation. See ``eval/README.md`` ("Web metric") for a complete task file.
"""

from __future__ import annotations

import re

from eval.web_metric.score import COMPONENTS, score_html

_FENCE = re.compile(r"```(?:html)?\s*\n(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)


def extract_html(generation: str) -> str:
    """The HTML inside a generation: the first fenced code block if any, else the text from ``<!DOCTYPE`` or
    ``<html`` on, else the stripped generation."""
    fenced = _FENCE.search(generation)
    if fenced:
        return fenced.group(1).strip()
    start = re.search(r"<!doctype|<html", generation, re.IGNORECASE)
    return generation[start.start():].strip() if start else generation.strip()


def process_results(doc: dict, results: list[str], reference_key: str = "html") -> dict[str, float]:
    """lm-eval ``process_results``: score ``results[0]`` against ``doc[reference_key]``.

    Returns ``design2code`` (the overall score) and ``d2c_<component>`` for the five components.
    """
    if reference_key not in doc:
        raise ValueError(f"document has no reference HTML under {reference_key!r}; keys: {sorted(doc)}")
    if not results:
        raise ValueError("results is empty: lm-eval passes one generation per document")
    score = score_html(doc[reference_key], extract_html(results[0]))
    return {"design2code": score.overall, **{f"d2c_{k}": getattr(score, k) for k in COMPONENTS}}
