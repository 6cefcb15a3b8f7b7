"""Swarm environments from the synthetic world, with verifiable answers: "wide" (aggregate over many scenes) and
"deep" (a chain of lookups).

Both are built from :func:`data_pipelines.synth.scenes.shapes_spec` scenes (the same generator the image
families draw), shown to the agents as short text descriptions (``scene 3: red circle, blue square``), which a
tiny model can read. The only environment tool is ``read_scene(index)``; each read is one tool call, and the
runtime allows a bounded number of environment calls per agent turn, so reading N scenes costs an agent about N
turns.

- **wide** (:func:`make_wide_task`): ``n_scenes`` scenes; the question asks for the number of shapes of one
  colour (or kind) over all of them. The sub-counts are independent, so the task decomposes: k sub-agents that
  each read ``n_scenes / k`` scenes finish in fewer *critical* steps than one agent reading all of them.
- **deep** (:func:`make_deep_task`): every scene also names a ``next`` scene; the question asks for the number
  of shapes in the scene reached after ``depth`` hops from a start scene. Each lookup depends on the previous
  one, so decomposition cannot shorten the chain (the control that rewards no parallelism).

Scoring: the final orchestrator message is parsed with :func:`rl.rewards.extract_answer` (``Answer: N``) and
:func:`rl.rewards.parse_int`; ``outcome = 1`` for the exact integer, else 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

from data_pipelines.synth.scenes import SHAPE_KINDS, shapes_spec
from rl.rewards import extract_answer, parse_int

SCENE_SIDE = 64  # pixels; with shapes of >= 10 px this holds 1-4 shapes


class ToolError(Exception):
    """A tool call the environment rejects; the runtime turns it into an error observation."""


@dataclass(frozen=True)
class ToolSpec:
    """An environment tool: ``args`` maps each required argument name to its Python type."""

    name: str
    description: str
    args: dict[str, type]


READ_SCENE = ToolSpec("read_scene", "read_scene(index: int) -> the description of scene `index`", {"index": int})


@dataclass
class SceneTask:
    """One episode's world: scene descriptions, the question and the integer answer."""

    kind: Literal["wide", "deep"]
    uid: str
    scenes: list[str]  # one text description per scene
    question: str
    answer: int
    meta: dict[str, Any] = field(default_factory=dict)  # what a scripted policy may read (target, chain start)

    @property
    def tools(self) -> dict[str, ToolSpec]:
        return {READ_SCENE.name: READ_SCENE}

    def call(self, name: str, args: dict[str, Any]) -> str:
        """Run an environment tool (arguments already type-checked by the runtime); raises :class:`ToolError`."""
        if name != READ_SCENE.name:
            raise ToolError(f"unknown environment tool '{name}'")
        index = args["index"]
        if not 0 <= index < len(self.scenes):
            raise ToolError(f"read_scene: index {index} out of range 0..{len(self.scenes) - 1}")
        return self.scenes[index]

    def score(self, final_text: str | None) -> float:
        """1.0 for the exact integer answer, else 0.0 (no final message -> 0)."""
        if final_text is None:
            return 0.0
        pred = parse_int(extract_answer(final_text))
        return float(pred == self.answer)


def _scene_objects(rng: random.Random, max_objects: int) -> list[dict[str, Any]]:
    return shapes_spec(rng, SCENE_SIDE, SCENE_SIDE, max_objects=max_objects)["objects"]


def describe_scene(index: int, objects: list[dict[str, Any]], next_index: int | None = None) -> str:
    """``scene 3: red circle, blue square`` (+ ``; next: scene 5`` in deep tasks)."""
    body = ", ".join(f"{o['color']} {o['kind']}" for o in objects)
    tail = f"; next: scene {next_index}" if next_index is not None else ""
    return f"scene {index}: {body}{tail}"


def make_wide_task(seed: int, n_scenes: int = 16, max_objects: int = 4,
                   attribute: Literal["color", "kind", "any"] = "color") -> SceneTask:  # fmt: skip
    """Count the shapes with one colour (or kind) over ``n_scenes`` scenes; the target value is drawn from those
    present so the answer is rarely 0."""
    if n_scenes < 1:
        raise ValueError(f"make_wide_task: n_scenes must be >= 1, got {n_scenes}")
    rng = random.Random(seed)
    objects = [_scene_objects(rng, max_objects) for _ in range(n_scenes)]
    attr = rng.choice(["color", "kind"]) if attribute == "any" else attribute
    present = sorted({o[attr] for objs in objects for o in objs})
    target = rng.choice(present)
    answer = sum(o[attr] == target for objs in objects for o in objs)
    noun = f"{target} shapes" if attr == "color" else f"{target}s"
    question = (f"Scenes 0 to {n_scenes - 1} each hold a few shapes. How many {noun} are there in all "
                f"{n_scenes} scenes together? End with 'Answer: N'.")  # fmt: skip
    scenes = [describe_scene(i, objs) for i, objs in enumerate(objects)]
    meta = {"attribute": attr, "target": target, "n_scenes": n_scenes}
    return SceneTask("wide", f"wide-{seed}", scenes, question, answer, meta)


def make_deep_task(seed: int, depth: int = 4, n_scenes: int = 8, max_objects: int = 4) -> SceneTask:
    """Follow ``next`` pointers ``depth`` times from a start scene; answer the shape count of the scene reached.
    The chain visits distinct scenes (``depth < n_scenes``)."""
    if not 1 <= depth < n_scenes:
        raise ValueError(f"make_deep_task: need 1 <= depth < n_scenes, got depth={depth}, n_scenes={n_scenes}")
    rng = random.Random(seed)
    objects = [_scene_objects(rng, max_objects) for _ in range(n_scenes)]
    order = rng.sample(range(n_scenes), n_scenes)  # the chain is order[0] -> order[1] -> ...
    nxt = {order[i]: order[(i + 1) % n_scenes] for i in range(n_scenes)}
    start, end = order[0], order[depth]
    question = (f"Start at scene {start} and follow 'next' {depth} times. How many shapes are in the scene "
                f"you reach? End with 'Answer: N'.")  # fmt: skip
    scenes = [describe_scene(i, objs, nxt[i]) for i, objs in enumerate(objects)]
    meta = {"start": start, "depth": depth, "n_scenes": n_scenes}
    return SceneTask("deep", f"deep-{seed}", scenes, question, len(objects[end]), meta)


def count_in_description(description: str, attribute: str, target: str) -> int:
    """How many shapes of ``target`` colour/kind a :func:`describe_scene` text lists (scripted workers use it)."""
    body = description.split(":", 1)[1].split(";", 1)[0]
    items = [item.strip().split(" ") for item in body.split(",") if item.strip()]
    pos = 0 if attribute == "color" else 1
    return sum(len(parts) == 2 and parts[pos] == target for parts in items)


__all__ = [
    "READ_SCENE",
    "SHAPE_KINDS",
    "SceneTask",
    "ToolError",
    "ToolSpec",
    "count_in_description",
    "describe_scene",
    "make_deep_task",
    "make_wide_task",
]
