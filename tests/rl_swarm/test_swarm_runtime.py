"""Swarm runtime: concurrent assignments overlap in time, failures and malformed calls become observations,
budgets hold, and the latency metrics count what they claim."""

from __future__ import annotations

import time

import pytest

from rl.swarm.envs import make_deep_task, make_wide_task
from rl.swarm.metrics import critical_steps, episode_metrics, total_steps
from rl.swarm.policies import ScriptedSwarmOrchestrator, scripted_single_agent, scripted_worker, split_evenly
from rl.swarm.runtime import RuntimeConfig, SwarmRuntime
from rl.swarm.toolcalls import format_turn

SLEEP = 1.0  # long against thread start-up on a loaded 2-core CI machine; serial would take 4 s


def _orchestrator(turns: list[str]):
    """Plays ``turns`` in order, then answers."""
    def policy(messages):
        i = sum(m["role"] == "assistant" for m in messages)
        return turns[i] if i < len(turns) else "Answer: 0"
    return policy


def _create(name: str = "w") -> tuple[str, dict]:
    return ("create_subagent", {"name": name, "system_prompt": "help"})


def _assign(prompt: str, agent: str = "w") -> tuple[str, dict]:
    return ("assign_task", {"agent": agent, "prompt": prompt})


def _sleepy_worker(messages):
    prompt = messages[-1]["content"]
    if prompt.startswith("fail"):
        raise RuntimeError("checkpoint exploded")
    time.sleep(SLEEP)
    return f"done {prompt}"


def _observations(ep, stage: int) -> list[str]:
    nxt = ep.stages[stage + 1].messages if stage + 1 < len(ep.stages) else None
    assert nxt is not None
    return [m["content"] for m in nxt if m["role"] == "tool"][-20:]


def test_assignments_in_one_turn_run_concurrently() -> None:
    turn = format_turn("", [_create(), *[_assign(f"job {i}") for i in range(4)]])
    rt = SwarmRuntime(_orchestrator([turn]), _sleepy_worker)
    t0 = time.perf_counter()
    ep = rt.run(make_wide_task(0, n_scenes=4))
    elapsed = time.perf_counter() - t0
    runs = ep.stages[0].runs
    assert [r.output for r in runs] == [f"done job {i}" for i in range(4)]
    assert max(r.t_start for r in runs) < min(r.t_end for r in runs)  # all four were running at one moment
    assert elapsed < 4 * SLEEP * 0.6, f"4 x {SLEEP}s sub-agents took {elapsed:.2f}s: not concurrent"
    assert critical_steps(ep) == (1 + 1) + 1 and total_steps(ep) == 2 + 4


def test_failing_subagent_is_an_observation() -> None:
    turn = format_turn("", [_create(), _assign("fail now"), _assign("ok")])
    ep = SwarmRuntime(_orchestrator([turn]), _sleepy_worker).run(make_wide_task(0, n_scenes=4))
    obs = _observations(ep, 0)
    assert any("error: sub-agent w failed: RuntimeError: checkpoint exploded" in o for o in obs)
    assert any(o == "w -> done ok" for o in obs)
    m = episode_metrics(ep)
    assert m["subagent_runs"] == 2 and m["finished_runs"] == 1 and ep.stop_reason == "answer"


@pytest.mark.parametrize("turn, expect", [
    (format_turn("", [_assign("x", agent="ghost")]), "no sub-agent named 'ghost'"),
    (format_turn("", [("launch_rockets", {})]), "unknown tool 'launch_rockets'"),
    (format_turn("", [("read_scene", {"index": "3"})]), "argument 'index' must be int"),
    (format_turn("", [("read_scene", {"index": True})]), "argument 'index' must be int"),
    (format_turn("", [("read_scene", {"index": 99})]), "out of range"),
    (format_turn("", [("read_scene", {})]), "missing arguments ['index']"),
    (format_turn("", [("read_scene", {"index": 1, "extra": 2})]), "unexpected ['extra']"),
    (format_turn("", [_create(), _create()]), "'w' already exists"),
    (format_turn("", [("create_subagent", {"name": " ", "system_prompt": "x"})]), "'name' is empty"),
    (format_turn("", [("read_scene", {"index": 0}), ("read_scene", {"index": 1})]), "only 1 environment call"),
    ("<|tool_calls_section_begin|><|tool_call_begin|>functions.read_scene:0<|tool_call_argument_begin|>{oops",
     "cut off"),
])  # fmt: skip
def test_bad_orchestrator_calls_are_error_observations(turn: str, expect: str) -> None:
    ep = SwarmRuntime(_orchestrator([turn]), _sleepy_worker).run(make_wide_task(0, n_scenes=4))
    assert any(expect in o and o.startswith("error") for o in _observations(ep, 0)), _observations(ep, 0)
    assert ep.stages[0].n_errors >= 1 and ep.stop_reason == "answer"


def test_single_agent_runtime_has_no_orchestration_tools() -> None:
    turn = format_turn("", [_create()])
    rt = SwarmRuntime(_orchestrator([turn]), None, RuntimeConfig(allow_subagents=False))
    ep = rt.run(make_wide_task(0, n_scenes=4))
    assert any("unknown tool 'create_subagent'" in o for o in _observations(ep, 0))
    assert "create_subagent" not in ep.stages[0].messages[0]["content"]
    with pytest.raises(ValueError, match="needs a subagent_policy"):
        SwarmRuntime(_orchestrator([]), None)


def test_subagent_cannot_spawn_and_is_cut_at_its_step_budget() -> None:
    def worker(messages):
        return format_turn("", [_create("nested")])  # never finishes

    turn = format_turn("", [_create(), _assign("go")])
    ep = SwarmRuntime(_orchestrator([turn]), worker, RuntimeConfig(subagent_max_steps=3)).run(make_wide_task(0))
    run = ep.stages[0].runs[0]
    assert run.steps == 3 and not run.finished and "no final message within 3 steps" in run.error


def test_total_budget_is_shared_by_all_agents() -> None:
    turn = format_turn("", [_create(), *[_assign(f"job {i}") for i in range(4)]])
    cfg = RuntimeConfig(max_total_steps=3)  # 1 orchestrator step + 2 sub-agent steps, then nothing
    ep = SwarmRuntime(_orchestrator([turn]), _sleepy_worker, cfg).run(make_wide_task(0, n_scenes=4))
    runs = ep.stages[0].runs
    assert sum(r.steps for r in runs) == 2 and sum("budget ran out" in (r.error or "") for r in runs) == 2
    assert ep.stop_reason == "total_budget" and ep.final_text is None and ep.outcome == 0.0


def test_orchestrator_budget() -> None:
    rt = SwarmRuntime(lambda m: format_turn("", [("read_scene", {"index": 0})]), None,
                      RuntimeConfig(allow_subagents=False, max_orchestrator_steps=5))  # fmt: skip
    ep = rt.run(make_wide_task(0))
    assert len(ep.stages) == 5 and ep.stop_reason == "orchestrator_budget" and ep.outcome == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_scripted_policies_solve_both_tasks(seed: int) -> None:
    for task in (make_wide_task(seed, n_scenes=16), make_deep_task(seed, depth=4)):
        single = SwarmRuntime(scripted_single_agent, None, RuntimeConfig(allow_subagents=False)).run(task)
        swarm = SwarmRuntime(ScriptedSwarmOrchestrator(4), scripted_worker).run(task)
        assert single.outcome == 1.0 and swarm.outcome == 1.0
        ms, mw = episode_metrics(single), episode_metrics(swarm)
        assert ms["serial_collapse"] == 1.0 and mw["serial_collapse"] == 0.0
        if task.kind == "wide":  # 16 reads + answer alone; create/assign, 4 reads + answer per worker, answer
            assert ms["critical_steps"] == 17 and mw["critical_steps"] == 1 + 5 + 1 and mw["total_steps"] == 22
        else:  # the chain cannot be split: delegating it only adds the orchestrator's two turns
            assert mw["critical_steps"] == ms["critical_steps"] + 2


def test_split_evenly() -> None:
    assert split_evenly(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split_evenly([1, 2], 8) == [[1], [2]]
    assert sum(split_evenly(list(range(16)), 4), []) == list(range(16))
