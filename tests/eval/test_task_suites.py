"""Offline suites: valid lm-eval tasks with absolute paths, no answer leaks, images/video/grounding helpers work."""

from __future__ import annotations

import json
import os

import pytest
from PIL import Image

from eval.tasks import VISION_TASKS, SuiteSpec, write_suites
from eval.tasks.doc_funcs import box_iou, doc_to_image, parse_box, process_grounding


@pytest.fixture(scope="module")
def suites(tmp_path_factory):
    out = tmp_path_factory.mktemp("suites")
    tasks = write_suites(SuiteSpec(out, n_per_family=2))
    return out, tasks


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_suites_load_with_a_local_task_manager_from_another_cwd(suites, tmp_path, monkeypatch):
    from lm_eval.tasks import TaskManager, get_task_dict

    out, tasks = suites
    monkeypatch.chdir(tmp_path)  # data_files are absolute, so the CWD does not matter
    tm = TaskManager(include_path=str(out), include_defaults=False)
    names = tasks["kimi_text"] + tasks["kimi_vision"]
    assert set(names) <= set(tm.all_tasks) and {"kimi_text", "kimi_vision"} <= set(tm.all_tasks)
    td = get_task_dict(names, tm)
    for name in names:
        task = td[name]
        assert len(task.eval_docs) > 0, name
    mc = td["kimi_text_mc"].eval_docs[0]
    assert mc["choices"][mc["label"]] == mc["answer"] and len(set(mc["choices"])) == len(mc["choices"])


def test_no_prompt_contains_its_answer_pairs(suites):
    out, _ = suites
    for name in ("kimi_text_gen", "kimi_text_mc"):
        for r in rows(out / "kimi_text" / f"{name}.jsonl"):
            assert "\nA: " not in r["prompt"] and r["prompt"].endswith("Answer:")
    for r in rows(out / "kimi_text" / "kimi_text_ppl.jsonl"):
        assert len(r["text"]) > 50


def test_vision_docs_give_images_and_video_frames(suites):
    out, _ = suites
    for name in VISION_TASKS:
        docs = rows(out / "kimi_vision" / f"{name}.jsonl")
        assert docs, name
        doc = docs[0]
        assert all(os.path.isabs(p) for p in doc["images"])
        visuals = doc_to_image(doc)
        assert visuals and all(isinstance(v, Image.Image) for v in visuals)
        if name.endswith("video"):
            assert doc["prompt"].startswith("<video>") and len(visuals) > 1
        else:
            assert doc["prompt"].count("<image>") == len(visuals)


def test_grounding_scoring():
    assert parse_box("box: [10, 20, 30.5, 40]") == [10.0, 20.0, 30.5, 40.0] and parse_box("none") is None
    assert box_iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0 and box_iou([0, 0, 10, 10], [5, 0, 15, 10]) == 1 / 3
    doc = {"answer": "[0, 0, 10, 10]"}
    assert process_grounding(doc, [" [0, 0, 10, 10]"]) == {"iou": 1.0, "acc_iou50": 1.0}
    assert process_grounding(doc, ["no idea"]) == {"iou": 0.0, "acc_iou50": 0.0}


def test_text_suite_runs_through_kimi_vl(suites, ckpt, tmp_path):
    from eval.ablation.collect import read_samples
    from eval.cli import main

    out, tasks = suites
    rc = main(["--model_args", f"checkpoint={ckpt},device=cpu,max_length=256", "--tasks", "kimi_text",
               "--include_path", str(out), "--limit", "3", "--bootstrap_iters", "0",
               "--samples_out", str(tmp_path / "s.json")])
    assert rc == 0
    samples = read_samples(tmp_path / "s.json")
    assert set(samples) == set(tasks["kimi_text"])
    assert samples["kimi_text_grounding"]["metric"] in ("iou", "acc_iou50")
    assert samples["kimi_text_ppl"]["metric"] == "bits_per_byte"


def test_integer_distractors_for_small_and_negative_answers():
    import random

    from eval.tasks.choices import mc_choices

    rng = random.Random(0)
    for a in (-5, -1, 0, 1, 2, 7):
        qa = {"answer": str(a), "answer_type": "int", "category": "arithmetic", "question": "?"}
        options, label = mc_choices(qa, {}, "", {}, rng)
        assert len(set(options)) == 4 and options[label] == str(a)
        assert a < 0 or all(int(o) >= 0 for o in options)


def test_summary_lists_group_members_apart_from_other_tasks(tmp_path, capsys):
    """``python -m eval.tasks`` prints each group's own tasks (what ``--tasks kimi_vision`` runs) and names the tasks
    it wrote outside the groups (the tool-use task) separately."""
    from eval.tasks.__main__ import main

    assert main(["--out", str(tmp_path / "s"), "--n", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    vision = next(line for line in lines if line.startswith("kimi_vision: "))
    assert vision.split(": ", 1)[1].split(", ") == list(VISION_TASKS)
    assert any(line.startswith("also written, outside the groups") and "kimi_vision_tooluse" in line for line in lines)
