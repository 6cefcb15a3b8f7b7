"""An offline lm-eval suite from a dataset folder's held-out questions (``kimi_data``): the eval split's verifiable
image and text questions of any family, e.g. the user's own from ``kimi-vl data convert --images questions.jsonl
--text text_questions.jsonl``.

``python -m eval.tasks --out DIR --data DATASET`` writes::

    DIR/kimi_data/   kimi_data_qa (image questions, short answers, exact match), kimi_data_grounding (boxes, IoU),
                     kimi_data_text (text questions about their context, exact match; boxes there by IoU in
                     kimi_data_text_grounding), images under media/, utils.py, and the group kimi_data

Prompts and scoring are the kimi_vision / kimi_text suites' (:mod:`eval.tasks.writer`): the images (or the
context), then ``Question: ...`` and ``Answer:``; exact match ignoring case, punctuation and surrounding
whitespace; IoU of the first box. Video questions are left out (a task here feeds images only). Tasks without
questions are not written.
"""

from __future__ import annotations

from pathlib import Path

from eval.tasks.writer import (
    EXACT_MATCH,
    UTILS_SHIM,
    _grounding_extra,
    _prompt,
    _task_yaml,
    _write_jsonl,
    _yaml,
)

GROUP = "kimi_data"
TASKS = ("kimi_data_qa", "kimi_data_grounding", "kimi_data_text", "kimi_data_text_grounding")


def write_dataset_suite(root: str | Path, out: str | Path, limit: int | None = None) -> list[str]:
    """Write ``out/kimi_data`` from the eval split of the dataset folder ``root``; returns the task names. Raises
    ``ValueError`` when the split has no image or text questions."""
    from data_pipelines.synth.tasks import eval_items

    d = Path(out) / GROUP
    media = d / "media"
    media.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {t: [] for t in TASKS}
    saved: dict[str, list[str]] = {}
    for item in eval_items(str(root), "vision", limit=limit):
        if item.videos or not item.images:
            continue
        sample = item.id.rsplit("#", 1)[0]
        if sample not in saved:
            saved[sample] = []
            for i, image in enumerate(item.images):
                path = media / f"{sample}_img{i}.png"
                image.save(path)
                saved[sample].append(str(path.resolve()))
        task = "kimi_data_grounding" if item.answer_type == "box" else "kimi_data_qa"
        rows[task].append({**_row(item), "prompt": "<image>" * len(saved[sample]) + "\n" + _prompt(item.question),
                           "images": saved[sample], "video": None})
    for item in eval_items(str(root), "text", limit=limit):
        task = "kimi_data_text_grounding" if item.answer_type == "box" else "kimi_data_text"
        rows[task].append({**_row(item), "prompt": _prompt(item.question, item.context)})
    if not any(rows.values()):
        raise ValueError(f"dataset {root}: its eval split has no image or text questions (records with 'qa'); "
                         "convert questions with `kimi-vl data convert --images FILE.jsonl` or `--text FILE.jsonl` "
                         "(a share goes to eval)")
    gen_kwargs = {"until": ["\n"], "max_gen_toks": 32, "do_sample": False}
    tasks = [t for t in TASKS if rows[t]]
    for name in tasks:
        _write_jsonl(d / f"{name}.jsonl", rows[name])
        extra = _grounding_extra(gen_kwargs) if name.endswith("grounding") else {
            "doc_to_text": "{{prompt}}", "doc_to_target": "{{answer}}", "generation_kwargs": gen_kwargs,
            "metric_list": [EXACT_MATCH]}
        if not name.startswith("kimi_data_text"):
            extra["doc_to_image"] = "!function utils.doc_to_image__FN_END__"
        _yaml(d / f"{name}.yaml", _task_yaml(name, d / f"{name}.jsonl", "generate_until", extra))
    (d / "utils.py").write_text(UTILS_SHIM)
    _yaml(d / f"{GROUP}.yaml", {"group": GROUP, "task": tasks})
    return tasks


def _row(item) -> dict:
    return {"id": item.id.replace("#", "_"), "family": item.family, "category": item.category, "answer": item.answer}


__all__ = ["GROUP", "TASKS", "write_dataset_suite"]
