"""Design2Code-style scores of a candidate HTML page against a reference (REFERENCE.md section 7).

Protocol (Si et al. 2024, "Design2Code", arXiv:2403.03163; details of this implementation in ``blocks.py``):
render both pages in headless Chromium, detect text blocks by recolouring, match blocks one-to-one by text
similarity with the Hungarian algorithm (``scipy.optimize.linear_sum_assignment``, maximising the sum of
``difflib.SequenceMatcher`` ratios) and drop pairs below ``min_text_similarity`` (0.5). Then, on [0, 1]:

- ``block_match``: matched block area / all block area, both pages' pixel areas summed;
- ``text``: mean character similarity (SequenceMatcher ratio) over matched pairs;
- ``position``: mean over pairs of ``1 - max(|dx|, |dy|)``, block centres in page-relative coordinates;
- ``color``: mean over pairs of ``max(0, 1 - CIEDE2000 / 100)`` between the blocks' rendered text colours;
- ``visual``: SSIM of the text-removed screenshots (``visual.py``; the method string is in every score);
- ``overall``: mean of the five.

Differences from the original: no merging of split blocks, SSIM instead of CLIP, text colour measured from
pixels of the original render. When neither page has text, the four block scores are 1; when only one has, 0.
A candidate that is not a string, is empty, fails to render, or renders as one flat colour scores 0 with
``reason`` set and a warning logged; a reference that fails raises.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

from data_pipelines.web.browser import ChromiumBrowser, RenderError, Viewport
from data_pipelines.web.render import shared_browser
from eval.web_metric.blocks import PageAnalysis, TextBlock, analyze_page
from eval.web_metric.ciede2000 import rgb_delta_e
from eval.web_metric.visual import VISUAL_METHOD, visual_similarity

logger = logging.getLogger(__name__)
COMPONENTS = ("block_match", "text", "position", "color", "visual")


@dataclass(frozen=True)
class WebMetricConfig:
    viewport: Viewport = field(default_factory=lambda: Viewport(512, 384))
    max_height: int = 4096
    min_text_similarity: float = 0.5
    visual_width: int = 160

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_text_similarity <= 1.0:
            raise ValueError(f"min_text_similarity must be in [0, 1], got {self.min_text_similarity}")
        if self.max_height < self.viewport.height or self.visual_width < 8:
            raise ValueError(f"need max_height >= viewport height and visual_width >= 8, got {self}")

    @property
    def visual_method(self) -> str:
        return VISUAL_METHOD.format(width=self.visual_width)


@dataclass(frozen=True)
class WebScore:
    """Scores of one page; ``reason`` is empty when the candidate was scored, else why it got 0."""

    block_match: float
    text: float
    position: float
    color: float
    visual: float
    overall: float
    n_reference_blocks: int
    n_candidate_blocks: int
    n_matched: int
    visual_method: str
    reason: str = ""

    @classmethod
    def zero(cls, reason: str, visual_method: str, n_reference_blocks: int = 0) -> WebScore:
        logger.warning("web metric: candidate scored 0: %s", reason)
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, n_reference_blocks, 0, 0, visual_method, reason)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class WebMetricReport:
    """Per-page scores and their means (``overall`` is the mean of the per-page overall scores)."""

    pages: list[WebScore]
    means: dict[str, float]
    overall: float
    visual_method: str

    def to_dict(self) -> dict:
        return {"overall": self.overall, "means": self.means, "visual_method": self.visual_method,
                "pages": [p.to_dict() for p in self.pages]}


def text_similarity_matrix(reference: Sequence[TextBlock], candidate: Sequence[TextBlock]) -> np.ndarray:
    """``[R, C]`` SequenceMatcher ratios between block texts."""
    sim_RC = np.zeros((len(reference), len(candidate)))
    for i, r in enumerate(reference):
        matcher = difflib.SequenceMatcher(None, autojunk=False)
        matcher.set_seq2(r.text)  # seq2 is the one SequenceMatcher indexes; reuse it across candidates
        for j, c in enumerate(candidate):
            matcher.set_seq1(c.text)
            sim_RC[i, j] = matcher.ratio()
    return sim_RC


def match_blocks(sim_RC: np.ndarray, min_similarity: float) -> list[tuple[int, int]]:
    """Optimal one-to-one pairs (Hungarian, maximum total similarity), without pairs below ``min_similarity``."""
    if sim_RC.size == 0:
        return []
    rows, cols = linear_sum_assignment(sim_RC, maximize=True)
    return [(int(i), int(j)) for i, j in zip(rows, cols) if sim_RC[i, j] >= min_similarity]


def block_scores(ref: PageAnalysis, cand: PageAnalysis, min_similarity: float) -> tuple[dict[str, float], int]:
    """Block-Match, Text, Position and Color of two analysed pages, and the number of matched pairs."""
    if not ref.blocks and not cand.blocks:
        return dict.fromkeys(COMPONENTS[:4], 1.0), 0
    sim_RC = text_similarity_matrix(ref.blocks, cand.blocks)
    pairs = match_blocks(sim_RC, min_similarity)
    if not pairs:
        return dict.fromkeys(COMPONENTS[:4], 0.0), 0
    total_area = sum(b.area for b in ref.blocks) + sum(b.area for b in cand.blocks)
    matched_area = sum(ref.blocks[i].area + cand.blocks[j].area for i, j in pairs)
    (rw, rh), (cw, ch) = ref.size, cand.size
    positions, colours_r, colours_c = [], [], []
    for i, j in pairs:
        (rx, ry), (cx, cy) = ref.blocks[i].centre(rw, rh), cand.blocks[j].centre(cw, ch)
        positions.append(1.0 - max(abs(rx - cx), abs(ry - cy)))
        colours_r.append(ref.blocks[i].colour)
        colours_c.append(cand.blocks[j].colour)
    delta_e = rgb_delta_e(np.array(colours_r), np.array(colours_c))
    scores = {
        "block_match": matched_area / total_area if total_area else 0.0,
        "text": float(np.mean([sim_RC[i, j] for i, j in pairs])),
        "position": float(np.mean(positions)),
        "color": float(np.mean(np.clip(1.0 - delta_e / 100.0, 0.0, 1.0))),
    }
    return scores, len(pairs)


def score_analyses(ref: PageAnalysis, cand: PageAnalysis, config: WebMetricConfig = WebMetricConfig()) -> WebScore:
    """All five scores and the overall score of two analysed pages."""
    method = config.visual_method
    if not cand.blocks and (cand.screenshot == cand.screenshot[:1, :1]).all():
        return WebScore.zero("candidate renders as a blank page", method, len(ref.blocks))
    scores, n_matched = block_scores(ref, cand, config.min_text_similarity)
    scores["visual"] = visual_similarity(ref.text_free, cand.text_free, config.visual_width)
    overall = float(np.mean([scores[k] for k in COMPONENTS]))
    return WebScore(**scores, overall=overall, n_reference_blocks=len(ref.blocks),
                    n_candidate_blocks=len(cand.blocks), n_matched=n_matched, visual_method=method)


def analyze_html(
    html: str, config: WebMetricConfig = WebMetricConfig(), browser: ChromiumBrowser | None = None
) -> PageAnalysis:
    """Render and analyse one page (reuse the result as ``reference=`` when scoring many candidates)."""
    return analyze_page(html, browser or shared_browser(), config.viewport, config.max_height)


def _candidate_problem(candidate: object) -> str:
    if candidate is None:
        return "candidate is None"
    if isinstance(candidate, bytes):
        try:
            candidate = candidate.decode("utf-8")
        except UnicodeDecodeError as err:
            return f"candidate bytes are not UTF-8 ({err.reason} at byte {err.start})"
    if not isinstance(candidate, str):
        return f"candidate is a {type(candidate).__name__}, not HTML text"
    if not candidate.strip():
        return "candidate is empty"
    return ""


def score_html(
    reference_html: str,
    candidate_html: str | bytes | None,
    config: WebMetricConfig = WebMetricConfig(),
    browser: ChromiumBrowser | None = None,
    reference: PageAnalysis | None = None,
) -> WebScore:
    """Score ``candidate_html`` against ``reference_html`` (pass ``reference=analyze_html(...)`` to reuse it).

    Never raises for a bad candidate (it scores 0 with ``reason``); raises ``RenderError`` if the reference cannot
    be rendered and ``ChromiumNotFoundError`` (with the install hint) if there is no browser.

    >>> score_html(page, page).overall  # doctest: +SKIP
    1.0
    """
    browser = browser or shared_browser()
    if reference is None:
        reference = analyze_html(reference_html, config, browser)
    problem = _candidate_problem(candidate_html)
    if problem:
        return WebScore.zero(problem, config.visual_method, len(reference.blocks))
    if isinstance(candidate_html, bytes):
        candidate_html = candidate_html.decode("utf-8")
    try:
        candidate = analyze_html(candidate_html, config, browser)
    except (RenderError, ValueError) as err:
        return WebScore.zero(f"candidate failed to render: {err}", config.visual_method, len(reference.blocks))
    return score_analyses(reference, candidate, config)


def score_pages(
    references: Sequence[str],
    candidates: Sequence[str | bytes | None],
    config: WebMetricConfig = WebMetricConfig(),
    browser: ChromiumBrowser | None = None,
) -> WebMetricReport:
    """Score candidates page by page; returns per-page :class:`WebScore` and the means."""
    if len(references) != len(candidates):
        raise ValueError(f"references and candidates differ in length: {len(references)} vs {len(candidates)}")
    pages = [score_html(r, c, config, browser) for r, c in zip(references, candidates)]
    means = {k: float(np.mean([getattr(p, k) for p in pages])) if pages else 0.0 for k in (*COMPONENTS, "overall")}
    return WebMetricReport(pages=pages, means=means, overall=means["overall"], visual_method=config.visual_method)


def make_reward(
    config: WebMetricConfig = WebMetricConfig(), browser: ChromiumBrowser | None = None, cache_size: int = 64
) -> Callable[[str, str], float]:
    """``reward(reference_html, candidate_html) -> overall score``, caching the last ``cache_size`` references
    (an RL group scores K candidates against one reference, which is then rendered once)."""
    cache: OrderedDict[str, PageAnalysis] = OrderedDict()

    def reward(reference_html: str, candidate_html: str) -> float:
        key = hashlib.sha256(reference_html.encode("utf-8")).hexdigest()
        if key not in cache:
            cache[key] = analyze_html(reference_html, config, browser)
            if len(cache) > cache_size:
                cache.popitem(last=False)
        cache.move_to_end(key)
        return score_html(reference_html, candidate_html, config, browser, reference=cache[key]).overall

    return reward
