"""kimi_text_mc: choices alone give nothing away (question-blind scorers score chance), and lm-eval scores a
uniform-likelihood model at chance on the generated task."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from scripted_lm import scripted_lm

from eval.tasks import SuiteSpec, write_suites
from eval.tasks.choices import mc_choices

TOL = 0.06  # ~2.5 standard errors at ~400 questions; generation is seeded, so the test is deterministic


@pytest.fixture(scope="module")
def mc_rows(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("mc")
    write_suites(SuiteSpec(out, n_per_family=70), ("kimi_text",))
    rows = [json.loads(line) for line in (out / "kimi_text" / "kimi_text_mc.jsonl").read_text().splitlines()]
    assert len(rows) >= 300
    return rows


def chance(rows: list[dict]) -> float:
    return sum(1 / len(r["choices"]) for r in rows) / len(rows)


def blind_accuracy(rows: list[dict], score) -> float:
    """Accuracy of a scorer that sees the choices (and the prompt text) but picks by ``score(choice, row)``;
    ties go to the first choice, as in lm-eval's argmax."""
    hits = 0
    for r in rows:
        scores = [score(c, r) for c in r["choices"]]
        hits += scores.index(max(scores)) == r["label"]
    return hits / len(rows)


def context_of(row: dict) -> str:
    return row["prompt"].rsplit("\nQuestion:", 1)[0]


def middle_int(choice: str, row: dict) -> float:
    ints = [int(c) for c in row["choices"] if re.fullmatch(r"-?\d+", c)]
    if len(ints) != len(row["choices"]):
        return 0.0
    return -abs(int(choice) - sorted(ints)[len(ints) // 2])


def string_preference(seed: int):
    """A fixed random preference per choice string (what an untrained model's token biases amount to)."""
    cache: dict[str, float] = {}

    def score(choice: str, row: dict) -> float:
        return cache.setdefault(choice, random.Random(f"{seed}/{choice}").random())

    return score


SCORERS = {
    "uniform": lambda c, r: 0.0,
    "shortest": lambda c, r: -len(c),
    "longest": lambda c, r: len(c),
    "fewest_words": lambda c, r: -len(c.split()),
    "middle_int": middle_int,
    "named_in_context": lambda c, r: float(re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", context_of(r))
                                           is not None),
    "last_named_in_context": lambda c, r: context_of(r).rfind(c),
}


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_question_blind_scorers_are_near_chance(mc_rows, name):
    acc, base = blind_accuracy(mc_rows, SCORERS[name]), chance(mc_rows)
    assert abs(acc - base) < TOL, f"{name}: {acc:.3f} vs chance {base:.3f}"


def test_fixed_string_preferences_are_near_chance_on_average(mc_rows):
    accs = [blind_accuracy(mc_rows, string_preference(s)) for s in range(8)]
    mean = sum(accs) / len(accs)
    assert abs(mean - chance(mc_rows)) < TOL / 2 and max(accs) < chance(mc_rows) + 2 * TOL, accs


def test_choices_are_of_the_answers_kind(mc_rows):
    for r in mc_rows:
        answer = r["answer"]
        assert r["choices"][r["label"]] == answer and len(set(r["choices"])) == len(r["choices"]) >= 2
        numeric = [bool(re.fullmatch(r"-?\d+", c)) for c in r["choices"]]
        assert all(numeric) or not any(numeric), r
        assert len({len(c.split()) for c in r["choices"]}) == 1, r
    labels = [r["label"] for r in mc_rows if len(r["choices"]) == 4]
    assert all(abs(labels.count(i) / len(labels) - 0.25) < 0.07 for i in range(4))


def test_integer_windows_hold_the_answer_anywhere():
    rng = random.Random(0)
    positions = {0: 0, 1: 0, 2: 0, 3: 0}
    for a in (-5, -1, 0, 1, 2, 7, 40):
        for _ in range(40):
            options, label = mc_choices({"answer": str(a), "answer_type": "int", "category": "arithmetic",
                                         "question": "?"}, {}, "", {}, rng)
            values = sorted(int(o) for o in options)
            assert options[label] == str(a) and values == list(range(values[0], values[0] + 4))
            assert a < 0 or values[0] >= 0
            if a >= 3:
                positions[values.index(a)] += 1
    assert min(positions.values()) > 10


def test_special_questions():
    rng = random.Random(0)
    qa = {"answer": "red square", "answer_type": "str", "category": "spatial",
          "question": "Which is higher, the red square or the blue circle?"}
    options, label = mc_choices(qa, {}, "", {}, rng)
    assert sorted(options) == ["blue circle", "red square"] and options[label] == "red square"
    spec = {"bars": [{"label": "oak", "value": 3}, {"label": "tin", "value": 9}, {"label": "pine", "value": 5}]}
    qa = {"answer": "9", "answer_type": "int", "category": "chart_value", "question": "What is the value of tin?"}
    assert sorted(mc_choices(qa, spec, "", {}, rng)[0]) == ["3", "5", "9"]
    qa = {"answer": "tin", "answer_type": "str", "category": "chart_value",
          "question": "Which category has the highest value in the table?"}
    assert sorted(mc_choices(qa, spec, "", {}, rng)[0]) == ["oak", "pine", "tin"]
    title = {"answer": "oasis by site", "answer_type": "str", "category": "ocr", "question": "What is the title?"}
    assert mc_choices(title, {}, 'A table titled "oasis by site"', {"ocr": ["kernel by team"]}, rng) is None


def test_lm_eval_scores_a_uniform_model_at_chance(tmp_path: Path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    write_suites(SuiteSpec(tmp_path, n_per_family=30), ("kimi_text",))
    rows = [json.loads(x) for x in (tmp_path / "kimi_text" / "kimi_text_mc.jsonl").read_text().splitlines()]
    tm = TaskManager(include_path=str(tmp_path), include_defaults=False)
    uniform = scripted_lm(loglikelihood=lambda reqs: [(-1.0, False) for _ in reqs])  # every choice equally likely
    res = simple_evaluate(model=uniform, tasks=["kimi_text_mc"], task_manager=tm, bootstrap_iters=0)
    metrics = res["results"]["kimi_text_mc"]
    assert abs(metrics["acc,none"] - chance(rows)) < 0.1, (metrics, chance(rows))
    assert abs(metrics["acc_norm,none"] - chance(rows)) < 0.1
