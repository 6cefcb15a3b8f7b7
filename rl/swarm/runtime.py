"""The swarm runtime: an orchestrator policy that creates sub-agents, assigns them tasks (concurrently within one
turn) and calls environment tools, until it answers or a step budget runs out.

A *policy* is any callable ``messages -> assistant text`` (the text may hold a tool-call section in the chat
format, see :mod:`rl.swarm.toolcalls`); :class:`rl.swarm.policies.ModelPolicy` wraps a project checkpoint,
scripted policies and test doubles are plain functions. Messages are chat dicts (``role`` in system / user /
assistant / tool, ``content`` a string) that :func:`data_pipelines.tokenizer.render_chat` renders.

Orchestrator tools (K2.5 Agent Swarm):

- ``create_subagent(name, system_prompt)``: registers a sub-agent template; sub-agents are *frozen* (one shared
  sub-agent policy, e.g. a frozen checkpoint, with the template's system prompt);
- ``assign_task(agent, prompt)``: runs one fresh instance of that sub-agent on ``prompt``. All assignments of
  one orchestrator turn run concurrently in a thread pool; each returns its final message (a turn without tool
  calls) as one observation. A sub-agent may call the environment's tools (not the orchestration ones) for up
  to ``subagent_max_steps`` turns; a policy that raises, a budget that runs out or a missing final message
  becomes an error observation;
- the environment's tools (``read_scene``), at most ``env_calls_per_turn`` per agent turn.

Creations are processed first, in call order, so one turn may create agents and assign to them. A turn without a
tool-call section (and without tool markers) is the final answer. Every policy call is one *step*; the global
budget ``max_total_steps`` counts the steps of all agents (a thread-safe counter), ``max_orchestrator_steps``
the orchestrator's turns. Malformed calls, unknown tools and bad arguments become ``tool`` observations that
start with ``error:``; nothing the policy writes can crash the runtime.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from rl.swarm.envs import SceneTask, ToolError, ToolSpec
from rl.swarm.toolcalls import ParsedTurn, ToolCall, describe_errors, parse_assistant_turn

Message = dict[str, Any]
Policy = Callable[[list[Message]], str]

CREATE = ToolSpec("create_subagent", "create_subagent(name: str, system_prompt: str) -> registers a sub-agent",
                  {"name": str, "system_prompt": str})  # fmt: skip
ASSIGN = ToolSpec("assign_task", "assign_task(agent: str, prompt: str) -> the sub-agent's final message; "
                  "several assign_task calls in one turn run in parallel", {"agent": str, "prompt": str})  # fmt: skip
ORCHESTRATION_TOOLS = {CREATE.name: CREATE, ASSIGN.name: ASSIGN}


@dataclass
class RuntimeConfig:
    max_orchestrator_steps: int = 24
    max_total_steps: int = 64  # all policy calls of the episode (orchestrator + sub-agents)
    subagent_max_steps: int = 8
    env_calls_per_turn: int = 1
    max_subagents: int = 16  # create_subagent calls that may succeed per episode
    max_parallel: int = 16  # assign_task calls that may run in one turn
    allow_subagents: bool = True  # False: a single agent (the orchestration tools do not exist)

    def __post_init__(self) -> None:
        for name in ("max_orchestrator_steps", "max_total_steps", "subagent_max_steps", "env_calls_per_turn",
                     "max_parallel"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"RuntimeConfig.{name} must be >= 1, got {getattr(self, name)}")


class StepBudget:
    """A thread-safe step counter shared by every agent of one episode."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.used >= self.limit:
                return False
            self.used += 1
            return True


@dataclass
class SubagentRun:
    agent: str
    prompt: str
    steps: int = 0
    finished: bool = False  # returned a final message within its budget
    output: str = ""
    error: str | None = None
    t_start: float = 0.0
    t_end: float = 0.0

    def observation(self) -> str:
        if self.finished:
            return f"{self.agent} -> {self.output}"
        return f"error: sub-agent {self.agent} failed: {self.error}"


@dataclass
class Stage:
    """One orchestrator turn and the sub-agent runs it started."""

    messages: list[Message]  # the orchestrator's context before this turn (for training)
    text: str  # what the orchestrator wrote
    n_calls: int = 0
    n_errors: int = 0  # parse errors + rejected calls
    env_calls: int = 0
    runs: list[SubagentRun] = field(default_factory=list)
    t_start: float = 0.0
    t_end: float = 0.0


StopReason = Literal["answer", "orchestrator_budget", "total_budget"]


@dataclass
class Episode:
    task: SceneTask
    stages: list[Stage] = field(default_factory=list)
    final_text: str | None = None
    outcome: float = 0.0
    created: list[str] = field(default_factory=list)
    stop_reason: StopReason = "orchestrator_budget"
    steps_used: int = 0
    wall_s: float = 0.0


def _check_args(spec: ToolSpec, args: dict[str, Any]) -> str | None:
    """An error message for missing / unexpected / mistyped arguments, else None."""
    missing = [k for k in spec.args if k not in args]
    extra = [k for k in args if k not in spec.args]
    if missing or extra:
        return f"{spec.name}: missing arguments {missing}, unexpected {extra} (signature: {spec.description})"
    for key, tp in spec.args.items():
        value = args[key]
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            return f"{spec.name}: argument '{key}' must be {tp.__name__}, got {type(value).__name__}"
        if tp is str and not value.strip():
            return f"{spec.name}: argument '{key}' is empty"
    return None


def tool_list(tools: dict[str, ToolSpec]) -> str:
    return "\n".join(f"- {t.description}" for t in tools.values())


def orchestrator_system_prompt(task: SceneTask, allow_subagents: bool, env_calls_per_turn: int) -> str:
    tools = {**(ORCHESTRATION_TOOLS if allow_subagents else {}), **task.tools}
    return (f"You solve the user's task with tools (at most {env_calls_per_turn} read_scene call per turn). "
            f"A reply without tool calls is your final answer.\nTools:\n{tool_list(tools)}")  # fmt: skip


def subagent_system_prompt(template: str, task: SceneTask, env_calls_per_turn: int) -> str:
    return (f"{template}\nTools (at most {env_calls_per_turn} call per turn; reply without tool calls to "
            f"finish):\n{tool_list(task.tools)}")  # fmt: skip


class _TurnExecutor:
    """Validates and executes one agent turn's calls; returns observations in call order."""

    def __init__(self, task: SceneTask, cfg: RuntimeConfig, orchestrator: bool):
        self.task, self.cfg, self.orchestrator = task, cfg, orchestrator
        self.env_calls, self.rejected = 0, 0
        self.obs: list[tuple[int, str]] = []

    def reject(self, index: int, message: str) -> None:
        self.rejected += 1
        self.obs.append((index, f"error: {message}"))

    def spec(self, call: ToolCall) -> ToolSpec | None:
        tools = dict(self.task.tools)
        if self.orchestrator and self.cfg.allow_subagents:
            tools.update(ORCHESTRATION_TOOLS)
        if call.name not in tools:
            where = "sub-agents may only call" if call.name in ORCHESTRATION_TOOLS and not self.orchestrator \
                else "known tools are"  # fmt: skip
            self.reject(call.index, f"unknown tool '{call.name}' ({where} {sorted(tools)})")
            return None
        why = _check_args(tools[call.name], call.arguments)
        if why:
            self.reject(call.index, why)
            return None
        return tools[call.name]

    def env_call(self, call: ToolCall) -> None:
        if self.env_calls >= self.cfg.env_calls_per_turn:
            self.reject(call.index, f"only {self.cfg.env_calls_per_turn} environment call(s) per turn; "
                                    f"'{call.name}' was not run")  # fmt: skip
            return
        self.env_calls += 1
        try:
            self.obs.append((call.index, f"{call.name} -> {self.task.call(call.name, call.arguments)}"))
        except ToolError as exc:
            self.reject(call.index, str(exc))

    def observations(self, parsed: ParsedTurn) -> list[Message]:
        texts = [describe_errors(parsed.errors)] if parsed.errors else []
        texts += [t for _, t in sorted(self.obs, key=lambda x: x[0])]
        return [{"role": "tool", "content": t} for t in texts]


class SwarmRuntime:
    """Runs episodes of ``orchestrator`` (+ frozen ``subagent_policy``) on tasks; see the module docstring."""

    def __init__(self, orchestrator: Policy, subagent_policy: Policy | None, cfg: RuntimeConfig | None = None):
        self.orchestrator, self.subagent_policy = orchestrator, subagent_policy
        self.cfg = cfg or RuntimeConfig()
        if self.cfg.allow_subagents and subagent_policy is None:
            raise ValueError("SwarmRuntime: allow_subagents=True needs a subagent_policy")

    def run(self, task: SceneTask) -> Episode:
        cfg, ep = self.cfg, Episode(task)
        budget, agents = StepBudget(cfg.max_total_steps), {}
        messages: list[Message] = [
            {"role": "system", "content": orchestrator_system_prompt(task, cfg.allow_subagents,
                                                                     cfg.env_calls_per_turn)},
            {"role": "user", "content": task.question},
        ]  # fmt: skip
        t0 = time.perf_counter()
        for _ in range(cfg.max_orchestrator_steps):
            if not budget.take():
                ep.stop_reason = "total_budget"
                break
            stage = Stage(messages=list(messages), text="", t_start=time.perf_counter() - t0)
            stage.text = self.orchestrator(messages)
            ep.stages.append(stage)
            parsed = parse_assistant_turn(stage.text)
            messages.append({"role": "assistant", "content": stage.text})
            if not parsed.has_section and parsed.ok:
                ep.final_text, ep.stop_reason = parsed.content, "answer"
                stage.t_end = time.perf_counter() - t0
                break
            observations = self._orchestrator_turn(parsed, stage, task, agents, budget, ep, t0)
            messages.extend(observations)
            stage.t_end = time.perf_counter() - t0
        ep.outcome, ep.steps_used, ep.wall_s = task.score(ep.final_text), budget.used, time.perf_counter() - t0
        return ep

    def _orchestrator_turn(self, parsed: ParsedTurn, stage: Stage, task: SceneTask, agents: dict[str, str],
                           budget: StepBudget, ep: Episode, t0: float) -> list[Message]:  # fmt: skip
        ex = _TurnExecutor(task, self.cfg, orchestrator=True)
        stage.n_calls = len(parsed.calls)
        valid = [(c, s) for c in parsed.calls if (s := ex.spec(c)) is not None]
        for call, _ in (x for x in valid if x[1] is CREATE):
            self._create(call, agents, ep, ex)
        assignments = []
        for call, spec in valid:
            if spec is ASSIGN:
                if call.arguments["agent"] not in agents:
                    ex.reject(call.index, f"assign_task: no sub-agent named '{call.arguments['agent']}' "
                                          f"(created: {sorted(agents)})")  # fmt: skip
                elif len(assignments) >= self.cfg.max_parallel:
                    ex.reject(call.index, f"assign_task: at most {self.cfg.max_parallel} assignments per turn")
                else:
                    assignments.append(call)
            elif spec is not CREATE:
                ex.env_call(call)
        stage.runs = self._run_parallel(assignments, agents, task, budget, t0)
        ex.obs += [(call.index, run.observation()) for call, run in zip(assignments, stage.runs)]
        stage.env_calls, stage.n_errors = ex.env_calls, ex.rejected + len(parsed.errors)
        return ex.observations(parsed)

    def _create(self, call: ToolCall, agents: dict[str, str], ep: Episode, ex: _TurnExecutor) -> None:
        name = call.arguments["name"].strip()
        if name in agents:
            ex.reject(call.index, f"create_subagent: '{name}' already exists")
        elif len(agents) >= self.cfg.max_subagents:
            ex.reject(call.index, f"create_subagent: at most {self.cfg.max_subagents} sub-agents per episode")
        else:
            agents[name] = call.arguments["system_prompt"]
            ep.created.append(name)
            ex.obs.append((call.index, f"create_subagent -> created sub-agent {name}"))

    def _run_parallel(self, calls: Sequence[ToolCall], agents: dict[str, str], task: SceneTask,
                      budget: StepBudget, t0: float) -> list[SubagentRun]:  # fmt: skip
        if not calls:
            return []
        jobs = [(c.arguments["agent"].strip(), c.arguments["prompt"]) for c in calls]
        with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="subagent") as pool:
            futures = [pool.submit(self._run_subagent, name, agents[name], prompt, task, budget, t0)
                       for name, prompt in jobs]  # fmt: skip
            return [f.result() for f in futures]

    def _run_subagent(self, name: str, template: str, prompt: str, task: SceneTask, budget: StepBudget,
                      t0: float) -> SubagentRun:  # fmt: skip
        run = SubagentRun(name, prompt, t_start=time.perf_counter() - t0)
        messages: list[Message] = [
            {"role": "system", "content": subagent_system_prompt(template, task, self.cfg.env_calls_per_turn)},
            {"role": "user", "content": prompt},
        ]
        run.error = f"no final message within {self.cfg.subagent_max_steps} steps"
        for _ in range(self.cfg.subagent_max_steps):
            if not budget.take():
                run.error = "the episode's step budget ran out"
                break
            run.steps += 1
            try:
                text = self.subagent_policy(list(messages))  # type: ignore[misc]
            except Exception as exc:  # a failing sub-agent is an observation, not a crash
                run.error = f"{type(exc).__name__}: {exc}"
                break
            parsed = parse_assistant_turn(text)
            messages.append({"role": "assistant", "content": text})
            if not parsed.has_section and parsed.ok:
                run.finished, run.output, run.error = True, parsed.content, None
                break
            ex = _TurnExecutor(task, self.cfg, orchestrator=False)
            for call in parsed.calls:
                if ex.spec(call) is not None:
                    ex.env_call(call)
            messages.extend(ex.observations(parsed))
        run.t_end = time.perf_counter() - t0
        return run


__all__ = [
    "ASSIGN",
    "CREATE",
    "Episode",
    "Message",
    "ORCHESTRATION_TOOLS",
    "Policy",
    "RuntimeConfig",
    "Stage",
    "StepBudget",
    "SubagentRun",
    "SwarmRuntime",
    "orchestrator_system_prompt",
    "subagent_system_prompt",
]
