"""Hierarchical paired bootstrap: 95% confidence intervals over questions and across seeds.

What is estimated
-----------------
One arm's score on one task is a matrix ``x_SQ`` (S training seeds x Q questions; every seed answers the same
Q questions). The score is a ratio of sums, ``sum(num_SQ) / sum(den_SQ)``: with ``den = 1`` it is the mean
accuracy (or any per-question mean); with ``num`` = per-document log-likelihood and ``den`` = its byte count
it is a corpus-level rate such as bits per byte. The target is the expected score of the recipe over the
population of training seeds *and* the population of questions the task samples from.

How it is resampled (one replicate)
-----------------------------------
0. Small-sample correction: each question's spread across seeds is scaled by ``sqrt(S / (S - 1))`` around
   its seed mean (:func:`inflate_seed_spread`), so that resampling S seeds reproduces the unbiased seed
   variance rather than ``(S - 1) / S`` of it. The point estimate uses the raw data.
1. Draw S seeds with replacement (``seed_counts_RS``: how often each seed is drawn).
2. Draw Q questions with replacement, once, and use the same draw for every drawn seed
   (``question_counts_RQ``). The question draw is shared because the seeds answer the same questions: the
   design is crossed (seeds x questions), so question difficulty is one source of variance, not S.
3. The replicate's score is ``sum_{s,q} w_s w_q num_sq / sum_{s,q} w_s w_q den_sq``.

The 95% interval is the 2.5th and 97.5th percentile of the replicates (percentile bootstrap); the point
estimate is the score on the original data.

Deltas against a baseline arm
-----------------------------
``delta = score(arm) - score(baseline)``, evaluated with the *same* question draw for both arms in every
replicate (paired over questions: a hard question is hard for both arms, which cancels out). Seeds are
paired too when both arms ran the same seed list (seed ``k`` of the arm shares data order and initial weights
with seed ``k`` of the baseline): one seed draw serves both arms. Otherwise each arm's seeds are drawn
independently. Besides the interval, :class:`DeltaEstimate` gives the share of replicates in which the delta
has the sign opposite to the point estimate, and a three-way verdict (better / worse / inconclusive) that
uses the metric's direction, so a result going the "wrong" way is named as such.

Caveats (printed into reports)
------------------------------
With few seeds (2-3) the seed-level variance is poorly estimated and, when seed-to-seed variation dominates,
percentile intervals undercover even after the correction (a t-interval on 3 seeds would use 4.30 standard
errors, the bootstrap uses ~1.96): reports print the seed count next to every interval. The
crossed two-way bootstrap otherwise slightly overestimates variance (it counts the seed x question noise
twice), which makes intervals a little conservative when S and Q are both large.

Sources: Efron & Tibshirani, *An Introduction to the Bootstrap* (1993), ch. 13 (percentile intervals);
Owen, "The pigeonhole bootstrap", Ann. Appl. Stat. 2007 (resampling rows and columns of crossed data);
Koehn, "Statistical significance tests for machine translation evaluation", EMNLP 2004 (paired resampling).

Shapes: R replicates, S seeds, Q questions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

Verdict = Literal["better", "worse", "inconclusive"]


@dataclass(frozen=True)
class Estimate:
    """A score with its percentile-bootstrap interval."""

    value: float
    lo: float
    hi: float
    n_seeds: int
    n_questions: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DeltaEstimate:
    """``arm - baseline`` with its interval; ``p_flip`` = share of replicates with the opposite sign."""

    value: float
    lo: float
    hi: float
    p_flip: float
    verdict: Verdict
    paired_seeds: bool
    n_questions: int

    def to_dict(self) -> dict:
        return asdict(self)


def _as_matrix(x: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name}: expected a [seeds, questions] matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name}: contains NaN or inf (shape {x.shape}); every seed must answer every question")
    return x


def _num_den(num: np.ndarray, den: np.ndarray | None, name: str) -> tuple[np.ndarray, np.ndarray]:
    num_SQ = _as_matrix(num, name)
    den_SQ = np.ones_like(num_SQ) if den is None else _as_matrix(den, f"{name} denominators")
    if den_SQ.shape != num_SQ.shape:
        raise ValueError(f"{name}: denominators have shape {den_SQ.shape}, values have {num_SQ.shape}")
    if (den_SQ <= 0).any():
        raise ValueError(f"{name}: denominators must be positive")
    return num_SQ, den_SQ


def _resampling_data(num_SQ: np.ndarray, den_SQ: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The seed-spread-corrected matrices the replicates are drawn from (denominators only if they stay > 0)."""
    den_inflated = inflate_seed_spread(den_SQ)
    return inflate_seed_spread(num_SQ), den_inflated if (den_inflated > 0).all() else den_SQ


def resample_counts(rng: np.random.Generator, n_rep: int, n: int) -> np.ndarray:
    """``[R, n]`` counts of each index in R draws of n indices with replacement (each row sums to n)."""
    idx_RN = rng.integers(0, n, size=(n_rep, n))
    flat = (idx_RN + n * np.arange(n_rep)[:, None]).ravel()
    return np.bincount(flat, minlength=n_rep * n).reshape(n_rep, n).astype(np.float64)


def weighted_ratio(num_SQ: np.ndarray, den_SQ: np.ndarray, seed_w_RS: np.ndarray, q_w_RQ: np.ndarray) -> np.ndarray:
    """Per-replicate ``sum w_s w_q num / sum w_s w_q den`` -> ``[R]`` (vectorised over replicates)."""
    num_RQ = seed_w_RS @ num_SQ
    den_RQ = seed_w_RS @ den_SQ
    return np.einsum("rq,rq->r", num_RQ, q_w_RQ) / np.einsum("rq,rq->r", den_RQ, q_w_RQ)


def weighted_ratio_reference(num_SQ: np.ndarray, den_SQ: np.ndarray, seeds: np.ndarray, questions: np.ndarray) -> float:
    """Readable reference for one replicate: index the drawn seeds and questions, then sum."""
    sub_num = num_SQ[np.ix_(seeds, questions)]
    sub_den = den_SQ[np.ix_(seeds, questions)]
    return float(sub_num.sum() / sub_den.sum())


def inflate_seed_spread(x_SQ: np.ndarray) -> np.ndarray:
    """Scale each question's deviations from its seed mean by ``sqrt(S / (S - 1))`` (identity for S = 1).

    Resampling S seeds reproduces their spread with the divisor S, i.e. ``(S - 1) / S`` of the unbiased
    variance; this small-sample correction (Davison & Hinkley 1997, sec. 2.4 / 3.8 "adjusted residuals") removes
    that bias, which matters with the 2-5 seeds ablations can afford.
    """
    S = x_SQ.shape[0]
    if S == 1:
        return x_SQ
    mean_Q = x_SQ.mean(0, keepdims=True)
    return mean_Q + np.sqrt(S / (S - 1)) * (x_SQ - mean_Q)


def _interval(reps_R: np.ndarray, alpha: float) -> tuple[float, float]:
    lo, hi = np.quantile(reps_R, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _check_alpha(alpha: float, n_boot: int) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")


def bootstrap_score(
    scores_SQ: np.ndarray,
    den_SQ: np.ndarray | None = None,
    *,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int | np.random.Generator = 0,
) -> Estimate:
    """Score of one arm on one task with a hierarchical (seeds, then questions) bootstrap interval.

    ``scores_SQ`` is ``[S, Q]`` (or ``[Q]`` for one seed); ``den_SQ`` optional positive denominators.
    """
    _check_alpha(alpha, n_boot)
    num, den = _num_den(scores_SQ, den_SQ, "scores_SQ")
    rng = np.random.default_rng(seed)
    S, Q = num.shape
    r_num, r_den = _resampling_data(num, den)
    reps_R = weighted_ratio(r_num, r_den, resample_counts(rng, n_boot, S), resample_counts(rng, n_boot, Q))
    lo, hi = _interval(reps_R, alpha)
    return Estimate(float(num.sum() / den.sum()), lo, hi, S, Q)


def bootstrap_delta(
    arm_SQ: np.ndarray,
    base_SQ: np.ndarray,
    arm_den_SQ: np.ndarray | None = None,
    base_den_SQ: np.ndarray | None = None,
    *,
    paired_seeds: bool | None = None,
    higher_is_better: bool = True,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int | np.random.Generator = 0,
) -> DeltaEstimate:
    """``score(arm) - score(baseline)`` with a paired hierarchical bootstrap interval.

    Both matrices must have the same questions in the same column order. ``paired_seeds=None`` pairs the
    seeds when both arms have the same number of seeds (the caller passes False when the seed lists differ).
    """
    _check_alpha(alpha, n_boot)
    a_num, a_den = _num_den(arm_SQ, arm_den_SQ, "arm_SQ")
    b_num, b_den = _num_den(base_SQ, base_den_SQ, "base_SQ")
    if a_num.shape[1] != b_num.shape[1]:
        raise ValueError(f"arm has {a_num.shape[1]} questions, baseline has {b_num.shape[1]}: they must match")
    if paired_seeds is None:
        paired_seeds = a_num.shape[0] == b_num.shape[0]
    if paired_seeds and a_num.shape[0] != b_num.shape[0]:
        raise ValueError(f"paired_seeds needs equal seed counts, got {a_num.shape[0]} and {b_num.shape[0]}")
    rng = np.random.default_rng(seed)
    Q = a_num.shape[1]
    q_w_RQ = resample_counts(rng, n_boot, Q)
    a_w_RS = resample_counts(rng, n_boot, a_num.shape[0])
    b_w_RS = a_w_RS if paired_seeds else resample_counts(rng, n_boot, b_num.shape[0])
    reps_R = weighted_ratio(*_resampling_data(a_num, a_den), a_w_RS, q_w_RQ) - weighted_ratio(
        *_resampling_data(b_num, b_den), b_w_RS, q_w_RQ
    )
    value = float(a_num.sum() / a_den.sum() - b_num.sum() / b_den.sum())
    lo, hi = _interval(reps_R, alpha)
    p_flip = float(np.mean(reps_R < 0) if value > 0 else np.mean(reps_R > 0) if value < 0 else 1.0)
    return DeltaEstimate(value, lo, hi, p_flip, verdict(lo, hi, higher_is_better), bool(paired_seeds), Q)


def verdict(lo: float, hi: float, higher_is_better: bool) -> Verdict:
    """"better"/"worse" when the interval excludes 0 (in the metric's good/bad direction), else inconclusive."""
    if lo > 0:
        return "better" if higher_is_better else "worse"
    if hi < 0:
        return "worse" if higher_is_better else "better"
    return "inconclusive"


__all__ = [
    "DeltaEstimate",
    "Estimate",
    "bootstrap_delta",
    "bootstrap_score",
    "inflate_seed_spread",
    "resample_counts",
    "verdict",
    "weighted_ratio",
    "weighted_ratio_reference",
]
