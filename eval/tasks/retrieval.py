"""``kimi_text_retrieval_<L>``: long-context key-value retrieval (needle in a haystack), one task per length.

Experiment 6 (KDA hybrid vs all-global attention) asks for "a long-context synthetic retrieval task". Each doc
is a registry of records ``The code of KEY is VALUE.`` and a question about one of them
(:mod:`data_pipelines.synth.retrieval`, the format the ``*_retrieval`` training presets teach). For every
context length ``L`` in ``SuiteSpec.retrieval_lengths`` (default none; experiment 6 uses 256, 1024, 4096) the
writer makes ``n_per_family`` docs whose prompt is about ``L`` tokens, with the needle at depths spread evenly
over ``[0, 1]`` (doc ``i`` at depth ``(i % 5) / 4``: first record, a quarter in, middle, three quarters, last).
Seeds come from the held-out ``test`` split (``sample_seed(seed, split, "retrieval_<L>", i)``), so the docs
are deterministic and never in training.

Length: with ``SuiteSpec.tokenizer`` (a tokenizer folder) records are added until the tokenized prompt reaches
``L`` tokens (``n_tokens`` in each row is exact); without one, at ``CHARS_PER_TOKEN`` characters per token
(``n_tokens`` is then that estimate). Scoring: ``generate_until`` (stop at a newline, 8 new tokens, greedy) and
exact match of the value, the usual needle-in-a-haystack metric (chance is ~0, no distractor design needed,
one prefill per doc). Per-length accuracy = the score of each task; ``needle_depth`` is in every row for
post-hoc depth analysis. Group: ``kimi_text_retrieval`` (not part of ``kimi_text``, so the quickstart is unchanged).
"""

from __future__ import annotations

import random
from typing import Any

CHARS_PER_TOKEN = 3.0
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
GROUP = "kimi_text_retrieval"
MAX_RECORDS = 6000  # distinct two-word keys available (data_pipelines.synth.common.WORDS)


def task_name(length: int) -> str:
    return f"{GROUP}_{length}"


def _counter(tokenizer: Any):
    if tokenizer is None:
        return lambda text: int(round(len(text) / CHARS_PER_TOKEN))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def retrieval_doc(seed: int, split: str, length: int, index: int, count=None) -> dict[str, Any]:
    """One held-out doc of about ``length`` prompt tokens (``count(text)`` counts tokens)."""
    from data_pipelines.synth.common import sample_seed
    from data_pipelines.synth.retrieval import HEADER, make_records, retrieval_prompt

    count = count or _counter(None)
    rng = random.Random(sample_seed(seed, split, task_name(length), index))
    # records needed: grow an estimate from the per-record cost until the prompt reaches the target
    pool = make_records(rng, min(MAX_RECORDS, max(64, length // 4)))
    per_record = max(1.0, count("\n".join(r.line() for r in pool[:20])) / 20)
    n = max(2, int((length - count(HEADER) - 16) / per_record))
    while n > 2 and count(retrieval_prompt(pool[:n], 0)) > length:
        n -= max(1, n // 50)
    while n < len(pool) and count(retrieval_prompt(pool[:n + 1], 0)) <= length:
        n += 1
    depth = DEPTHS[index % len(DEPTHS)]
    while True:  # the asked key's length differs from record 0's: shrink until the real prompt fits
        needle = int(round(depth * (n - 1)))
        prompt = retrieval_prompt(pool[:n], needle)
        if n <= 2 or count(prompt) <= length:
            break
        n -= 1
    return {"id": f"{split}_{task_name(length)}_{index:08d}", "prompt": prompt, "answer": pool[needle].value,
            "n_records": n, "needle_index": needle, "needle_depth": depth, "target_tokens": length,
            "n_tokens": count(prompt)}


def retrieval_rows(seed: int, split: str, length: int, n: int, tokenizer: Any = None) -> list[dict[str, Any]]:
    if length < 32:
        raise ValueError(f"retrieval length must be >= 32 tokens, got {length}")
    count = _counter(tokenizer)
    return [retrieval_doc(seed, split, length, i, count) for i in range(n)]


def retrieval_yaml_extra(exact_match: dict[str, Any]) -> dict[str, Any]:
    return {"doc_to_text": "{{prompt}}", "doc_to_target": "{{answer}}",
            "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False},
            "metric_list": [exact_match]}


__all__ = ["CHARS_PER_TOKEN", "DEPTHS", "GROUP", "retrieval_doc", "retrieval_rows", "retrieval_yaml_extra",
           "task_name"]
