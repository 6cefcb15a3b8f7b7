"""Answer choices of the ``kimi_text_mc`` multiple-choice task, built so that choices alone give nothing away.

A model that never reads the question must score chance (the mean of ``1 / len(choices)``). The first version
leaked the answer three ways (measured: an untrained model scored 0.92 on 12 questions, docs/results/
quickstart-2026-11-21): integer distractors were sampled around the answer (so "pick the middle value" won),
string distractors came from a pool of the whole category (numbers offered for "which category is highest",
"yes"/"no" for "which is higher, A or B?"), and distractors of another kind or length than the answer won or
lost on token count alone. Here every question gets choices of its own kind:

- ``yesno``: ``["yes", "no"]``;
- ``int``: 4 consecutive integers with the answer at a uniformly random position (the window is shifted up,
  never cut, when it would go below 0 for a non-negative answer);
- "..., the A or the B?": exactly ``[A, B]``;
- "the value of X in the table": other values of the same table (all named in the context, so "the number
  that appears in the text" does not pick the answer);
- "which category ... highest": other labels of the same table;
- other strings: candidates of the same category and the same number of words; when the answer is named in
  the context, only candidates named there too (fewer choices rather than giveaway ones), else the category
  pool. A question whose answer is named but no candidate is (the table's title) is left out of the task
  (it stays in ``kimi_text_gen``): ``mc_choices`` returns None.

Choices are shuffled with the suite's seeded RNG. Tests (tests/eval/test_mc_choices.py) check that
question-blind scorers (a uniform likelihood, the shortest/longest choice, the middle integer, "named in the
context", a fixed random preference per string) stay near chance.
"""

from __future__ import annotations

import random
import re
from typing import Any

FALLBACK_CHOICES = {
    "color": ["red", "green", "blue", "yellow", "orange", "purple", "black", "cyan"],
    "shape": ["circle", "square", "triangle", "hexagon", "diamond", "star"],
    "motion": ["left", "right", "up", "down"],
}
N_CHOICES = 4
_EITHER = re.compile(r"the (.+?) or the (.+?)\?$")


def _ints(answer: int, rng: random.Random) -> list[str]:
    start = answer - rng.randrange(N_CHOICES)
    if answer >= 0:
        start = max(0, start)
    return [str(v) for v in range(start, start + N_CHOICES)]


def _words(text: str) -> int:
    return len(text.split())


def _named(text: str, context: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(text)}(?![\w-])", context) is not None


def _some(answer: str, others: list[str], rng: random.Random) -> list[str]:
    others = sorted(set(others) - {answer})
    return [answer] + rng.sample(others, min(N_CHOICES - 1, len(others)))


def _strings(qa: dict[str, Any], spec: dict[str, Any], context: str, pool: dict[str, list[str]],
             rng: random.Random) -> list[str] | None:
    answer, question = qa["answer"], qa["question"]
    either = _EITHER.search(question)
    if either and answer in either.groups():
        return list(either.groups())
    if "highest value" in question and spec.get("bars"):
        return _some(answer, [b["label"] for b in spec["bars"]], rng)
    same = [x for x in pool.get(qa["category"], []) + FALLBACK_CHOICES.get(qa["category"], [])
            if _words(x) == _words(answer) and not x.lstrip("-").isdigit()]
    if not _named(answer, context):
        return _some(answer, same, rng)
    named = [x for x in same if x != answer and _named(x, context)]
    return _some(answer, named, rng) if named else None


def mc_choices(qa: dict[str, Any], spec: dict[str, Any], context: str, pool: dict[str, list[str]],
               rng: random.Random) -> tuple[list[str], int] | None:
    """``(choices, index of the answer)`` for one question, or None to leave it out (see the module docstring).

    ``pool`` maps a category to answers seen in the suite (candidates for string distractors). A question that
    would get fewer than two choices is left out; choices without the answer or with repeats raise ValueError."""
    answer, kind = qa["answer"], qa["answer_type"]
    if kind == "yesno":
        options = ["yes", "no"]
    elif kind == "int" and qa["category"] == "chart_value" and spec.get("bars"):
        options = _some(answer, [str(b["value"]) for b in spec["bars"]], rng)
    elif kind == "int":
        options = _ints(int(answer), rng)
    else:
        options = _strings(qa, spec, context, pool, rng)
    if options is None or len(options) < 2:
        return None
    if answer not in options or len(set(options)) != len(options):
        raise ValueError(f"question {qa['question']!r}: bad choices {options} for answer {answer!r}")
    rng.shuffle(options)
    return options, options.index(answer)


__all__ = ["FALLBACK_CHOICES", "mc_choices"]
