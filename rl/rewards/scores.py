"""Verifiable rewards as pure functions of a parsed prediction and the ground truth (K2.5 section 6).

Every function returns a float in [0, 1]; the formula is in its docstring. Boxes are
``[x1, y1, x2, y2]`` with x1 <= x2, y1 <= y2; points are ``[x, y]``; both in the same units as the
ground truth (pixels or normalised coordinates). Source: Kimi K2.5 report, outcome-based vision RL
(grounding/points soft F1 under an optimal assignment, OCR 1 - normalised edit distance, counting
shaped by |pred - gt|), plus chart values by relative error and exact / multiple-choice answers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from rl.rewards.parsers import parse_number


def counting_reward(pred: int, gt: int) -> float:
    """``r = max(0, 1 - |pred - gt| / max(gt, 1))``: 1 when exact, falling linearly to 0 at an error of
    ``max(gt, 1)`` (so an error of 1 on gt = 10 keeps 0.9, on gt = 1 gives 0)."""
    if gt < 0:
        raise ValueError(f"counting_reward: gt must be >= 0, got {gt}")
    return max(0.0, 1.0 - abs(pred - gt) / max(gt, 1))


def box_iou_matrix(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]]) -> np.ndarray:
    """``IoU[i, j] = area(p_i & g_j) / area(p_i | g_j)`` (0 when the union is empty). Shape [n_pred, n_gt]."""
    p = np.asarray(pred, dtype=np.float64).reshape(-1, 4)  # [n, 4]
    g = np.asarray(gt, dtype=np.float64).reshape(-1, 4)  # [m, 4]
    ix1 = np.maximum(p[:, None, 0], g[None, :, 0])
    iy1 = np.maximum(p[:, None, 1], g[None, :, 1])
    ix2 = np.minimum(p[:, None, 2], g[None, :, 2])
    iy2 = np.minimum(p[:, None, 3], g[None, :, 3])
    inter = np.clip(ix2 - ix1, 0, None) * np.clip(iy2 - iy1, 0, None)  # [n, m]
    area_p = (p[:, 2] - p[:, 0]) * (p[:, 3] - p[:, 1])
    area_g = (g[:, 2] - g[:, 0]) * (g[:, 3] - g[:, 1])
    union = area_p[:, None] + area_g[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def point_score_matrix(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]], sigma: float) -> np.ndarray:
    """``S[i, j] = exp(-||p_i - g_j||^2 / (2 sigma^2))``. Shape [n_pred, n_gt]."""
    if sigma <= 0:
        raise ValueError(f"point_score_matrix: sigma must be > 0, got {sigma}")
    p = np.asarray(pred, dtype=np.float64).reshape(-1, 2)
    g = np.asarray(gt, dtype=np.float64).reshape(-1, 2)
    d2 = ((p[:, None, :] - g[None, :, :]) ** 2).sum(-1)
    return np.exp(-d2 / (2.0 * sigma**2))


def soft_f1(scores_NM: np.ndarray) -> float:
    """Soft F1 under the optimal one-to-one assignment of a score matrix [n_pred, n_gt] in [0, 1].

    ``S = max over matchings of sum of matched scores`` (Hungarian); soft precision ``S / n``, soft
    recall ``S / m``, ``F1 = 2 P R / (P + R) = 2 S / (n + m)``. Both empty -> 1; exactly one empty -> 0.
    A duplicated prediction can match only one target, so it lowers precision.
    """
    n, m = scores_NM.shape
    if n == 0 and m == 0:
        return 1.0
    if n == 0 or m == 0:
        return 0.0
    rows, cols = linear_sum_assignment(scores_NM, maximize=True)
    total = float(scores_NM[rows, cols].sum())
    return 2.0 * total / (n + m)


def grounding_reward(pred_boxes: Sequence[Sequence[float]], gt_boxes: Sequence[Sequence[float]]) -> float:
    """Soft F1 (:func:`soft_f1`) of predicted vs ground-truth boxes with IoU as the match score."""
    n, m = len(pred_boxes), len(gt_boxes)
    return soft_f1(box_iou_matrix(pred_boxes, gt_boxes) if n and m else np.zeros((n, m)))


def pointing_reward(
    pred_points: Sequence[Sequence[float]], gt_points: Sequence[Sequence[float]], sigma: float
) -> float:
    """Soft F1 (:func:`soft_f1`) of points with score ``exp(-d^2 / (2 sigma^2))``."""
    n, m = len(pred_points), len(gt_points)
    return soft_f1(point_score_matrix(pred_points, gt_points, sigma) if n and m else np.zeros((n, m)))


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (unit-cost insert, delete, substitute), O(len(a) * len(b)) time, O(len(b)) memory."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def ocr_reward(pred: str, gt: str, normalize_whitespace: bool = True) -> float:
    """``r = 1 - lev(pred, gt) / max(len(pred), len(gt))``; both empty -> 1. With ``normalize_whitespace``
    runs of whitespace become one space and the ends are stripped first (case is kept)."""
    if normalize_whitespace:
        pred, gt = " ".join(pred.split()), " ".join(gt.split())
    longest = max(len(pred), len(gt))
    if longest == 0:
        return 1.0
    return 1.0 - edit_distance(pred, gt) / longest


def chart_value_reward(pred: float, gt: float, eps: float = 1e-8) -> float:
    """``r = max(0, 1 - |pred - gt| / max(|gt|, eps))``: relative error, 0 at 100 % error or worse."""
    if not (math.isfinite(pred) and math.isfinite(gt)):
        return 0.0
    return max(0.0, 1.0 - abs(pred - gt) / max(abs(gt), eps))


def normalize_text(s: str) -> str:
    """Lower-case, strip, collapse whitespace, drop one trailing period."""
    s = " ".join(s.lower().split())
    return s[:-1].rstrip() if s.endswith(".") else s


def exact_reward(pred: str, gt: str) -> float:
    """``r = 1[normalize(pred) == normalize(gt)]``, or numeric equality (|p - g| <= 1e-9 max(1, |g|)) when both
    are numbers (so ``"4.0"`` matches ``"4"``)."""
    p, g = parse_number(pred), parse_number(gt)
    if p is not None and g is not None:
        return float(abs(p - g) <= 1e-9 * max(1.0, abs(g)))
    return float(normalize_text(pred) == normalize_text(gt))


def choice_reward(pred: str, gt: str) -> float:
    """``r = 1[pred letter == gt letter]`` (both upper-cased)."""
    return float(pred.strip().upper() == gt.strip().upper())


__all__ = [
    "box_iou_matrix",
    "chart_value_reward",
    "choice_reward",
    "counting_reward",
    "edit_distance",
    "exact_reward",
    "grounding_reward",
    "normalize_text",
    "ocr_reward",
    "point_score_matrix",
    "pointing_reward",
    "soft_f1",
]
