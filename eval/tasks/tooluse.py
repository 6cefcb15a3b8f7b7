"""``kimi_vision_tooluse``: how often a model answers a visual question by calling the image tool (experiment 7).

Design (the simplest honest one): the held-out visual questions of the ``shapes``, ``ocr``, ``chart`` and
``document`` families (one question per sample, grounding included), each asked in the chat format of the
zero-vision SFT transcripts (:mod:`data_pipelines.synth.toolsft`): the same system message offering the
``python`` tool on the image handle ``img``, then a user turn with the image attached and the transcripts'
wording ("The image `img` (WxH pixels) is loaded; you can run Python on it." + the question), then the
assistant header. Every arm gets the same prompt (the image-text arm can use the tool too, or answer from the
pixels). The model generates one assistant turn (``until: <|im_end|>``, 160 new tokens, greedy) with its
special tokens kept (``keep_special_tokens``, a generation key of the ``kimi_vl`` model), and
:func:`eval.tasks.doc_funcs.process_tooluse` scores

- ``tool_call``: the turn makes a well-formed ``python`` call (closed section, JSON object arguments with a
  ``code`` string) -- the tool-use rate of experiment 7;
- ``tool_attempt``: any tool-call marker (well-formed or not).

The tool is never executed and the final answer is not scored here (the ``kimi_vision_*`` tasks score
answers); the rate says whether SFT taught the model to reach for the tool on images. lm-eval's ``hf`` model
strips special tokens from generations (and would pass ``keep_special_tokens`` to ``generate``), so this task
needs ``--model kimi_vl``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

TOOLUSE_TASK = "kimi_vision_tooluse"
TOOLUSE_FAMILIES = ("shapes", "ocr", "chart", "document")
GEN_KWARGS = {"until": ["<|im_end|>"], "max_gen_toks": 160, "do_sample": False, "keep_special_tokens": True}


def tool_prompt(question: str, width: int, height: int) -> str:
    """The chat prompt of one question (image placeholder ``<image>`` where the image goes)."""
    from data_pipelines.synth.toolsft import TOOL_SYSTEM
    from data_pipelines.tokenizer import ROLE_HEADERS

    user = f"<image>The image `img` ({width}x{height} pixels) is loaded; you can run Python on it.\n{question}"
    return (ROLE_HEADERS["system"] + TOOL_SYSTEM + "<|im_end|>" + ROLE_HEADERS["user"] + user + "<|im_end|>"
            + ROLE_HEADERS["assistant"])


def tooluse_rows(samples: dict[str, list[Any]], media_dir: Path, seed: int) -> list[dict[str, Any]]:
    """One row per sample of ``samples[family]`` (its media already written under ``media_dir`` as
    ``KEY_NAME``), the question picked with a seeded RNG."""
    rng = random.Random(f"{seed}/{TOOLUSE_TASK}")
    rows = []
    for family in TOOLUSE_FAMILIES:
        for s in samples[family]:
            if len(s.media) != 1 or s.media[0].kind != "image":
                raise ValueError(f"{TOOLUSE_TASK}: sample {s.meta['key']} needs exactly one image")
            media = s.media[0]
            path = media_dir / f"{s.meta['key']}_{media.name}"
            if not path.exists():
                path.write_bytes(media.data)
            qa = rng.choice(s.qa)
            rows.append({"id": s.meta["key"], "category": qa["category"], "family": family,
                         "prompt": tool_prompt(qa["question"], media.width, media.height), "answer": qa["answer"],
                         "images": [str(path.resolve())], "video": None})
    return rows


def tooluse_yaml_extra() -> dict[str, Any]:
    return {"doc_to_text": "{{prompt}}", "doc_to_target": "{{answer}}", "generation_kwargs": dict(GEN_KWARGS),
            "doc_to_image": "!function utils.doc_to_image__FN_END__",
            "process_results": "!function utils.process_tooluse__FN_END__",
            "metric_list": [{"metric": "tool_call", "aggregation": "mean", "higher_is_better": True},
                            {"metric": "tool_attempt", "aggregation": "mean", "higher_is_better": True}]}


__all__ = ["GEN_KWARGS", "TOOLUSE_FAMILIES", "TOOLUSE_TASK", "tool_prompt", "tooluse_rows", "tooluse_yaml_extra"]
