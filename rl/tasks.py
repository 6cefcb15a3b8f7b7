"""Prompt sources for RL: where verifiable prompts come from, and the built-in text counting family.

A prompt source yields :class:`rl.rollout.Prompt` objects for training (``sample``) and a fixed held-out
list (``heldout``) drawn from disjoint seeds. The built-in :class:`LetterCountSource` is a text-only
verifiable family (``"a:abaab="`` -> ``3``: how many ``a`` in the word) over a character tokenizer
(:class:`CharTokenizer`); it is small enough that a CPU run can show RL raising held-out reward, and it
serves as the text arm of the vision-vs-text control when no text world is configured.
"""

from __future__ import annotations

import random
import string
from typing import Protocol

from rl.rollout import Prompt


class PromptSource(Protocol):
    families: list[str]

    def sample(self, n: int, rng: random.Random) -> list[Prompt]: ...

    def heldout(self, n: int) -> list[Prompt]: ...


class Tokenizer(Protocol):
    eos_token_id: int
    pad_token_id: int

    def decode(self, ids: list[int]) -> str: ...


class CharTokenizer:
    """One id per character: ``0`` pad, ``1`` bos, ``2`` eos, then ``alphabet`` in order (unknown chars raise)."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    def __init__(self, alphabet: str = string.ascii_lowercase + string.digits + " =?:<>/[],."):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("CharTokenizer: alphabet has repeated characters")
        self.alphabet = alphabet
        self.index = {c: i + 3 for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + 3

    def encode(self, text: str, bos: bool = True) -> list[int]:
        missing = sorted({c for c in text if c not in self.index})
        if missing:
            raise ValueError(f"CharTokenizer.encode: characters {missing} are not in the alphabet")
        return ([self.bos_token_id] if bos else []) + [self.index[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.alphabet[i - 3] for i in ids if 3 <= i < self.vocab_size)


class LetterCountSource:
    """``"a:<word>="`` -> the number of ``a`` in ``<word>`` (family ``counting``); words of ``min_len`` to
    ``max_len`` letters from ``letters``. Training prompts use seeds ``>= 2**32``; held-out ones ``< 2**32``."""

    families = ["counting"]

    def __init__(
        self, tokenizer: CharTokenizer, letters: str = "ab", min_len: int = 2, max_len: int = 6, seed: int = 0
    ):
        if not 1 <= min_len <= max_len:
            raise ValueError(f"LetterCountSource: need 1 <= min_len <= max_len, got {min_len}, {max_len}")
        self.tokenizer, self.letters, self.min_len, self.max_len, self.seed = tokenizer, letters, min_len, max_len, seed

    def _prompt(self, rng: random.Random, uid: str) -> Prompt:
        word = "".join(rng.choice(self.letters) for _ in range(rng.randint(self.min_len, self.max_len)))
        target = self.letters[0]
        text = f"{target}:{word}="
        return Prompt(self.tokenizer.encode(text), "counting", word.count(target), uid=uid)

    def sample(self, n: int, rng: random.Random) -> list[Prompt]:
        return [self._prompt(random.Random(rng.getrandbits(62) + 2**32), f"train-{i}") for i in range(n)]

    def heldout(self, n: int) -> list[Prompt]:
        rng = random.Random(self.seed)
        return [self._prompt(random.Random(rng.getrandbits(31)), f"heldout-{i}") for i in range(n)]


__all__ = ["CharTokenizer", "LetterCountSource", "PromptSource", "Tokenizer"]
