"""Key-value retrieval documents (needle in a haystack) for long-context training and evaluation.

A document is a registry of ``n`` records ``The code of KEY is VALUE.`` (KEY = two words joined by a hyphen,
VALUE = a 5-digit number, both unique in the document), then one question about a record at a chosen depth::

    A registry lists access codes.
    The code of maple-tiger is 48213.
    ...
    Question: What is the code of maple-tiger?
    Answer: 48213

The ``retrieval`` family (text stream) gives training documents of 4 to 40 records with the asked record at a
uniformly random position, so a model can learn the format; it is only in the ``*_retrieval`` presets (the
default presets, and the golden files built from them, are unchanged). The held-out task of experiment 6
(``eval/tasks/retrieval.py``) builds longer documents with the same functions and seeds of the ``test`` split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from data_pipelines.synth.common import WORDS, Sample

HEADER = "A registry lists access codes."
TRAIN_RECORDS = (4, 40)


@dataclass(frozen=True)
class Record:
    key: str
    value: str

    def line(self) -> str:
        return f"The code of {self.key} is {self.value}."


def make_records(rng: random.Random, n: int) -> list[Record]:
    """``n`` records with distinct keys and distinct values."""
    if not 1 <= n <= len(WORDS) * (len(WORDS) - 1):
        raise ValueError(f"n must be in [1, {len(WORDS) * (len(WORDS) - 1)}], got {n}")
    keys: set[str] = set()
    values: set[int] = set()
    while len(keys) < n:
        a, b = rng.sample(WORDS, 2)
        keys.add(f"{a}-{b}")
    while len(values) < n:
        values.add(rng.randrange(10000, 100000))
    key_list, value_list = sorted(keys), sorted(values)
    rng.shuffle(key_list)
    rng.shuffle(value_list)
    return [Record(k, str(v)) for k, v in zip(key_list, value_list)]


def retrieval_prompt(records: list[Record], needle: int) -> str:
    """The haystack and the question about ``records[needle]``, ending in ``Answer:`` (the value follows)."""
    if not 0 <= needle < len(records):
        raise ValueError(f"needle index {needle} outside the {len(records)} records")
    lines = [HEADER] + [r.line() for r in records]
    return "\n".join(lines) + f"\nQuestion: What is the code of {records[needle].key}?\nAnswer:"


def make_retrieval(rng: random.Random, ctx: Any) -> Sample:
    """One training document (``ctx`` is a :class:`~data_pipelines.synth.families.FamilyContext`)."""
    records = make_records(rng, rng.randint(*TRAIN_RECORDS))
    needle = rng.randrange(len(records))
    answer = records[needle].value
    text = retrieval_prompt(records, needle) + " " + answer
    qa = {"category": "retrieval", "question": f"What is the code of {records[needle].key}?", "answer": answer,
          "answer_type": "int"}
    return Sample(family="retrieval", stream="text", doc=[{"text": text}], qa=[qa],
                  spec={"type": "retrieval", "records": len(records), "needle": needle})


__all__ = ["HEADER", "Record", "make_records", "make_retrieval", "retrieval_prompt"]
