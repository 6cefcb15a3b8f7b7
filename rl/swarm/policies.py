"""Policies for the swarm runtime: rule-based (scripted) baselines and a project checkpoint as a policy.

A policy maps the chat messages so far to the next assistant text. The scripted ones read only what a model
would read (the question and the tool observations in ``messages``) and emit well-formed tool calls:

- :func:`scripted_single_agent` - solves a wide or deep task alone, one ``read_scene`` per turn, then answers;
- :class:`ScriptedSwarmOrchestrator` - always decomposes: creates one worker template and assigns ``k`` workers
  contiguous slices of the scenes in one turn (a deep task, which cannot be split, goes to one worker), then
  sums the workers' numbers and answers;
- :func:`scripted_worker` - the frozen sub-agent of the scripted runs: the single-agent solver on its prompt;
- :class:`Delayed` - adds a fixed *simulated* per-step latency (``time.sleep``) to any policy, standing in for
  decode time so wall-clock comparisons of scripted runs mean something (labelled as simulated in reports).

:class:`ModelPolicy` renders the messages with :func:`data_pipelines.tokenizer.render_chat`, samples with
:func:`rl.rollout.sample_groups` until ``<|im_end|>`` (recording token ids and log-probs of each turn for
training) and decodes with special tokens kept, so the tool-call markers reach the parser.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from data_pipelines.tokenizer import placeholder_ids, render_chat
from rl.rewards import extract_answer, parse_int
from rl.rollout import Prompt, SamplingConfig, sample_groups
from rl.swarm.envs import SHAPE_KINDS, count_in_description
from rl.swarm.runtime import Message, Policy
from rl.swarm.toolcalls import format_turn

_WIDE_ALL = re.compile(r"Scenes 0 to (\d+) each hold")
_WIDE_LIST = re.compile(r"in scenes ([\d, ]+)\?")
_NOUN = re.compile(r"How many (\w+?)(?: shapes|s) are there")
_DEEP = re.compile(r"Start at scene (\d+) and follow 'next' (\d+) times")
_READ = re.compile(r"^read_scene -> (scene (\d+):.*)$")
_WORKER_OUT = re.compile(r"^(\S+) -> (.*)$")

WORKER_TEMPLATE = "You are a worker. Answer the question with one number."


def _question(messages: Sequence[Message]) -> str:
    return next(m["content"] for m in messages if m["role"] == "user")


def _reads(messages: Sequence[Message]) -> dict[int, str]:
    """Scene index -> description, from this conversation's ``read_scene`` observations."""
    out = {}
    for m in messages:
        if m["role"] == "tool" and (hit := _READ.match(m["content"])):
            out[int(hit.group(2))] = hit.group(1)
    return out


def wide_spec(question: str) -> tuple[str, str, list[int]] | None:
    """``(attribute, target, scene indices)`` of a wide question (the task's or a worker's), else None."""
    noun = _NOUN.search(question)
    if noun is None or _DEEP.search(question):
        return None
    if (whole := _WIDE_ALL.search(question)) is not None:
        indices = list(range(int(whole.group(1)) + 1))
    elif (part := _WIDE_LIST.search(question)) is not None:
        indices = [int(x) for x in part.group(1).replace(" ", "").split(",") if x]
    else:
        return None
    target = noun.group(1)
    return ("kind" if target in SHAPE_KINDS else "color"), target, indices


def _solve_wide(spec: tuple[str, str, list[int]], reads: dict[int, str]) -> str:
    attribute, target, indices = spec
    todo = [i for i in indices if i not in reads]
    if todo:
        return format_turn("", [("read_scene", {"index": todo[0]})])
    return f"Answer: {sum(count_in_description(reads[i], attribute, target) for i in indices)}"


def _solve_deep(start: int, depth: int, reads: dict[int, str]) -> str:
    current = start
    for _ in range(depth):
        if current not in reads:
            return format_turn("", [("read_scene", {"index": current})])
        current = int(reads[current].rsplit("next: scene ", 1)[1])
    if current not in reads:
        return format_turn("", [("read_scene", {"index": current})])
    body = reads[current].split(":", 1)[1].split(";", 1)[0]
    return f"Answer: {len([x for x in body.split(',') if x.strip()])}"


def scripted_single_agent(messages: list[Message]) -> str:
    """Solve the question alone, one read per turn (wide: every listed scene; deep: the chain), then answer."""
    question = _question(messages)
    if (deep := _DEEP.search(question)) is not None:
        return _solve_deep(int(deep.group(1)), int(deep.group(2)), _reads(messages))
    spec = wide_spec(question)
    if spec is None:
        return "Answer: 0"
    return _solve_wide(spec, _reads(messages))


scripted_worker = scripted_single_agent


def split_evenly(indices: Sequence[int], k: int) -> list[list[int]]:
    """``k`` contiguous, near-equal slices (no empty slice; fewer slices when there are fewer indices)."""
    k = max(1, min(k, len(indices)))
    q, r = divmod(len(indices), k)
    out, pos = [], 0
    for i in range(k):
        n = q + (i < r)
        out.append(list(indices[pos : pos + n]))
        pos += n
    return out


@dataclass
class ScriptedSwarmOrchestrator:
    """Always decomposes into ``k`` workers in the first turn, then sums their answers."""

    k: int = 4

    def __call__(self, messages: list[Message]) -> str:
        outputs = [hit.group(2) for m in messages if m["role"] == "tool"
                   if (hit := _WORKER_OUT.match(m["content"])) and hit.group(1).startswith("worker")]  # fmt: skip
        if outputs or any(m["role"] == "assistant" for m in messages):
            values = [parse_int(extract_answer(o)) for o in outputs]
            return f"Answer: {sum(v for v in values if v is not None)}"
        question = _question(messages)
        calls: list[tuple[str, dict[str, Any]]] = [("create_subagent", {"name": "worker",
                                                                         "system_prompt": WORKER_TEMPLATE})]
        spec = wide_spec(question)
        if spec is None:  # a deep task: the chain cannot be split, one worker follows it
            calls.append(("assign_task", {"agent": "worker", "prompt": question}))
        else:
            attribute, target, indices = spec
            noun = f"{target} shapes" if attribute == "color" else f"{target}s"
            for part in split_evenly(indices, self.k):
                prompt = f"How many {noun} are there in scenes {', '.join(map(str, part))}?"
                calls.append(("assign_task", {"agent": "worker", "prompt": prompt}))
        return format_turn(f"I split the task over {len(calls) - 1} worker(s).", calls)


@dataclass
class Delayed:
    """``policy`` plus a fixed simulated latency of ``seconds`` per call."""

    policy: Policy
    seconds: float

    def __call__(self, messages: list[Message]) -> str:
        time.sleep(self.seconds)
        return self.policy(messages)


@dataclass
class TurnSample:
    """One sampled model turn: what training needs to rescore it."""

    prompt_ids: list[int]
    response_ids: torch.Tensor  # [T] long
    logprobs: torch.Tensor  # [T] fp32 (sampling-time log-probs)
    text: str


class ModelPolicy:
    """A causal LM checkpoint (e.g. ``KimiVLForCausalLM``) as a swarm policy; records each turn in ``self.turns``.

    ``tokenizer`` is a transformers tokenizer with the chat/tool special tokens (``data_pipelines.tokenizer``).
    Each call draws from its own generator seeded ``seed + call index`` (thread-safe use as a sub-agent)."""

    def __init__(self, model: Any, tokenizer: Any, sampling: SamplingConfig, seed: int = 0,
                 max_prompt_tokens: int = 2048):
        self.model, self.tok, self.sampling = model, tokenizer, sampling
        self.max_prompt_tokens, self.seed = max_prompt_tokens, seed
        vocab = tokenizer.get_vocab()
        self.stop_ids = [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
        self.pad_id = vocab["<|pad|>"]
        self.banned_ids = placeholder_ids(tokenizer)  # never sampled: a forward over them would expect pixel values
        self.turns: list[TurnSample] = []
        self._lock, self._calls = threading.Lock(), 0

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def encode_messages(self, messages: Sequence[Message]) -> list[int]:
        text = "".join(p[0] for p in render_chat(messages, train_on="none", add_generation_prompt=True))
        ids = self.tok.encode(text, add_special_tokens=False)
        return ids[-self.max_prompt_tokens :]

    def __call__(self, messages: list[Message]) -> str:
        ids = self.encode_messages(messages)
        with self._lock:
            device = next(self.model.parameters()).device
            gen, self._calls = torch.Generator(device=device).manual_seed(self.seed + self._calls), self._calls + 1
        group = sample_groups(self.model, [Prompt(ids, "swarm", None)], 1, self.sampling, self.stop_ids,
                              self.pad_id, self.decode, gen, self.banned_ids)[0]  # fmt: skip
        n = int(group.lengths[0])
        resp = group.response_ids_KT[0, :n]
        text = self.decode([i for i in resp.tolist() if i not in self.stop_ids])
        with self._lock:
            self.turns.append(TurnSample(ids, resp.clone(), group.logprobs_KT[0, :n].clone(), text))
        return text


__all__ = [
    "Delayed",
    "ModelPolicy",
    "ScriptedSwarmOrchestrator",
    "TurnSample",
    "WORKER_TEMPLATE",
    "scripted_single_agent",
    "scripted_worker",
    "split_evenly",
    "wide_spec",
]
