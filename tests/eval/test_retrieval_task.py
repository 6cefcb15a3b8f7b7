"""kimi_text_retrieval_<L>: deterministic held-out docs of the requested lengths, the needle where it should be,
the training family in the same format, exact-match scoring through lm-eval, experiments 6/7 name real tasks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from scripted_lm import scripted_lm

from data_pipelines.synth import PRESETS, generate_sample, get_preset
from eval.tasks import SuiteSpec, write_suites
from eval.tasks.retrieval import DEPTHS, retrieval_rows

RECORD = re.compile(r"The code of ([a-z]+-[a-z]+) is (\d{5})\.")
QUESTION = re.compile(r"Question: What is the code of ([a-z]+-[a-z]+)\?\nAnswer:$")


def check_doc(row: dict) -> None:
    records = RECORD.findall(row["prompt"])
    keys = [k for k, _ in records]
    asked = QUESTION.search(row["prompt"]).group(1)
    assert len(set(keys)) == len(keys) == row["n_records"] and keys.count(asked) == 1
    assert dict(records)[asked] == row["answer"] and keys.index(asked) == row["needle_index"]
    assert row["needle_index"] == round(row["needle_depth"] * (row["n_records"] - 1))


def test_docs_are_deterministic_sized_and_hold_the_needle():
    from tiny_lm import make_tokenizer

    tok = make_tokenizer()
    for length in (128, 600):
        rows = retrieval_rows(0, "test", length, 10, tok)
        assert rows == retrieval_rows(0, "test", length, 10, tok)
        assert rows != retrieval_rows(1, "test", length, 10, tok)
        for i, r in enumerate(rows):
            check_doc(r)
            assert r["n_tokens"] == len(tok.encode(r["prompt"], add_special_tokens=False))
            longest = max(len(tok.encode(f"\nThe code of {k} is {v}.", add_special_tokens=False))
                          for k, v in RECORD.findall(r["prompt"]))
            assert length - 2 * longest < r["n_tokens"] <= length, (r["n_tokens"], longest)  # about a record short
            assert r["needle_depth"] == DEPTHS[i % len(DEPTHS)] and r["id"].startswith("test_")
    estimated = retrieval_rows(0, "test", 1024, 3)
    assert all(0.9 * 1024 <= r["n_tokens"] <= 1024 for r in estimated)
    with pytest.raises(ValueError, match="length"):
        retrieval_rows(0, "test", 8, 1)


def test_training_family_uses_the_same_format_and_default_presets_are_unchanged():
    p = get_preset("tiny_retrieval")
    assert p.train == {**PRESETS["tiny"].train, "retrieval": 60} and "retrieval" not in PRESETS["tiny"].train
    for i in range(5):
        s = generate_sample(p, 0, "train", "retrieval", i)
        text = s.doc[0]["text"]
        prompt, answer = text.rsplit(" ", 1)
        check_doc({"prompt": prompt, "answer": answer, "n_records": s.spec["records"],
                   "needle_index": s.spec["needle"], "needle_depth": s.spec["needle"] / max(1, s.spec["records"] - 1)})
        assert answer == s.qa[0]["answer"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("retr")
    tasks = write_suites(SuiteSpec(out, n_per_family=2, retrieval_lengths=(64, 256)), ("kimi_text",))
    assert tasks["kimi_text"][-2:] == ["kimi_text_retrieval_64", "kimi_text_retrieval_256"]
    return out


def test_default_suites_write_no_retrieval_task(tmp_path):
    tasks = write_suites(SuiteSpec(tmp_path, n_per_family=1), ("kimi_text",))
    assert not any("retrieval" in t for t in tasks["kimi_text"])
    assert not list((tmp_path / "kimi_text").glob("*retrieval*"))


def test_exact_match_per_length_through_lm_eval(suite):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    def read_registry(requests):
        """Answers by reading the registry: right for the 64-token docs, a wrong code for the others."""
        out = []
        for r in requests:
            prompt = r.args[0]
            value = dict(RECORD.findall(prompt))[QUESTION.search(prompt).group(1)]
            short = len(RECORD.findall(prompt)) < 8
            out.append(f" {value}" if short else " 00000")
        return out

    tm = TaskManager(include_path=str(suite), include_defaults=False)
    assert "kimi_text_retrieval" in tm.all_tasks and "kimi_text_retrieval" not in \
        (suite / "kimi_text" / "kimi_text.yaml").read_text()
    res = simple_evaluate(model=scripted_lm(generate_until=read_registry), tasks=["kimi_text_retrieval"],
                          task_manager=tm, bootstrap_iters=0)
    assert res["results"]["kimi_text_retrieval_64"]["exact_match,none"] == 1.0
    assert res["results"]["kimi_text_retrieval_256"]["exact_match,none"] == 0.0


CONFIGS = Path(__file__).resolve().parents[2] / "kimi_vl" / "configs" / "experiments"


def written_tasks(exp, out: Path) -> set[str]:
    spec = SuiteSpec(out, 1, exp.eval.suite_preset, retrieval_lengths=tuple(exp.eval.retrieval_lengths))
    return {t for names in write_suites(spec).values() for t in names}


@pytest.mark.parametrize("name, needed", [("6_kda_hybrid", {"kimi_text_retrieval_256", "kimi_text_retrieval_1024",
                                                           "kimi_text_retrieval_4096"}),
                                          ("7_zero_vision_sft", {"kimi_vision_tooluse"})])
def test_experiments_6_and_7_evaluate_tasks_the_writer_writes(name, needed, tmp_path):
    from eval.ablation import load_experiment

    exp = load_experiment(CONFIGS / f"{name}.yaml")
    tasks = {exp.task_metric(t)[0] for t in exp.eval.tasks}
    assert needed <= tasks
    if name.startswith("6"):  # sized with the training tokenizer of the retrieval preset the arms train on
        assert exp.eval.suite_tokenizer == "synth:tiny_retrieval" and "data.path=synth:tiny_retrieval" in \
            exp.base_overrides
        exp.eval.retrieval_lengths = [64, 128, 256]  # same writer path, small docs
        tasks = {t.replace("_1024", "_128").replace("_4096", "_64") for t in tasks}
    else:
        assert exp.task_metric("kimi_vision_tooluse:tool_call") == ("kimi_vision_tooluse", "tool_call")
    assert tasks <= written_tasks(exp, tmp_path)
