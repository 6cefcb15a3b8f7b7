"""Task family -> reward: parse the response (format check), then score it against the ground truth.

A reward function takes the response text and the task's ground truth (plus per-task options such
as ``sigma`` for points) and returns a :class:`RewardResult`. If the family's parser cannot read the
answer (see :mod:`rl.rewards.parsers`), the reward is exactly 0 and ``parsed`` is False, so the trainer
can report the share of unparseable answers.

Built-in families and their ground-truth types:

| family            | ground truth                  | score (rl.rewards.scores) |
| ----------------- | ----------------------------- | ------------------------- |
| `counting`        | int                           | counting_reward           |
| `grounding`       | list of [x1, y1, x2, y2]      | grounding_reward          |
| `pointing`        | list of [x, y] (+ ``sigma``)  | pointing_reward           |
| `ocr`             | str                           | ocr_reward                |
| `chart`           | float                         | chart_value_reward        |
| `multiple_choice` | option letter (+ ``num_options``) | choice_reward         |
| `exact`           | str (numbers compare numerically) | exact_reward          |

:func:`register_reward` adds a family or an alias (e.g. the data pipeline's family names).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rl.rewards import parsers, scores


@dataclass(frozen=True)
class RewardResult:
    reward: float  # in [0, 1]
    parsed: bool  # False: the answer could not be parsed (reward is then 0)


RewardFn = Callable[..., RewardResult]
UNPARSED = RewardResult(0.0, False)


def _counting(response: str, gt: int, **_: Any) -> RewardResult:
    pred = parsers.parse_int(parsers.extract_answer(response))
    return UNPARSED if pred is None else RewardResult(scores.counting_reward(pred, int(gt)), True)


def _grounding(response: str, gt: list, **_: Any) -> RewardResult:
    pred = parsers.parse_boxes(parsers.extract_answer(response))
    return UNPARSED if pred is None else RewardResult(scores.grounding_reward(pred, gt), True)


def _pointing(response: str, gt: list, sigma: float = 0.05, **_: Any) -> RewardResult:
    pred = parsers.parse_points(parsers.extract_answer(response))
    return UNPARSED if pred is None else RewardResult(scores.pointing_reward(pred, gt, sigma), True)


def _ocr(response: str, gt: str, **_: Any) -> RewardResult:
    answer = parsers.extract_answer(response)
    return RewardResult(scores.ocr_reward(answer, str(gt)), True)


def _chart(response: str, gt: float, **_: Any) -> RewardResult:
    pred = parsers.parse_number(parsers.extract_answer(response))
    return UNPARSED if pred is None else RewardResult(scores.chart_value_reward(pred, float(gt)), True)


def _multiple_choice(response: str, gt: str, num_options: int | None = None, **_: Any) -> RewardResult:
    pred = parsers.parse_choice(parsers.extract_answer(response), num_options)
    return UNPARSED if pred is None else RewardResult(scores.choice_reward(pred, str(gt)), True)


def _exact(response: str, gt: Any, **_: Any) -> RewardResult:
    answer = parsers.extract_answer(response)
    return UNPARSED if not answer else RewardResult(scores.exact_reward(answer, str(gt)), True)


REWARDS: dict[str, RewardFn] = {
    "counting": _counting,
    "grounding": _grounding,
    "pointing": _pointing,
    "ocr": _ocr,
    "chart": _chart,
    "multiple_choice": _multiple_choice,
    "exact": _exact,
}


def register_reward(family: str, fn: RewardFn | str) -> None:
    """Map ``family`` to a reward function, or (given a string) alias it to an existing family."""
    if isinstance(fn, str):
        if fn not in REWARDS:
            raise ValueError(f"register_reward: unknown target family '{fn}' (known: {sorted(REWARDS)})")
        fn = REWARDS[fn]
    REWARDS[family] = fn


def get_reward(family: str) -> RewardFn:
    if family not in REWARDS:
        raise ValueError(f"no reward registered for task family '{family}' (known: {sorted(REWARDS)})")
    return REWARDS[family]


def compute_reward(family: str, response: str, gt: Any, **options: Any) -> RewardResult:
    """Score one response of task family ``family`` against ground truth ``gt``."""
    return get_reward(family)(response, gt, **options)


__all__ = ["REWARDS", "RewardResult", "compute_reward", "get_reward", "register_reward"]
