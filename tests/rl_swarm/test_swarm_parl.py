"""PARL reward terms and the annealing schedules."""

from __future__ import annotations

import math

import pytest

from rl.swarm.envs import make_wide_task
from rl.swarm.parl import AnnealSchedule, PARLConfig, parl_terms, r_finish, r_parallel
from rl.swarm.policies import ScriptedSwarmOrchestrator, scripted_single_agent, scripted_worker
from rl.swarm.runtime import RuntimeConfig, SwarmRuntime
from rl.swarm.toolcalls import format_turn


def test_r_parallel_saturates() -> None:
    assert [r_parallel(n, 4) for n in (0, 1, 2, 4, 9)] == [0.0, 0.25, 0.5, 1.0, 1.0]
    with pytest.raises(ValueError, match="cap"):
        r_parallel(1, 0)


def test_r_finish_is_share_completed() -> None:
    assert r_finish(0, 0) == 0.0 and r_finish(3, 4) == 0.75 and r_finish(2, 2) == 1.0
    with pytest.raises(ValueError):
        r_finish(3, 2)


def test_linear_schedule() -> None:
    s = AnnealSchedule(start=0.5, hold_steps=2, anneal_steps=4, kind="linear")
    assert [s.value(t) for t in range(8)] == [0.5, 0.5, 0.5, 0.375, 0.25, 0.125, 0.0, 0.0]


def test_cosine_schedule() -> None:
    s = AnnealSchedule(start=1.0, hold_steps=0, anneal_steps=10, kind="cosine")
    assert s.value(0) == 1.0 and s.value(10) == 0.0 and s.value(50) == 0.0
    assert s.value(5) == pytest.approx(0.5)
    assert s.value(2) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.2)))
    values = [s.value(t) for t in range(12)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone non-increasing


@pytest.mark.parametrize("bad", [dict(start=-1.0), dict(anneal_steps=0), dict(hold_steps=-1), dict(kind="exp")])
def test_schedule_validation(bad: dict) -> None:
    with pytest.raises(ValueError):
        AnnealSchedule(**bad)


def _cfg(l1: float, l2: float) -> PARLConfig:
    return PARLConfig(AnnealSchedule(l1, 0, 10), AnnealSchedule(l2, 0, 10), parallel_cap=4)


def test_terms_of_scripted_episodes() -> None:
    task = make_wide_task(1, n_scenes=8)
    swarm = SwarmRuntime(ScriptedSwarmOrchestrator(2), scripted_worker).run(task)
    single = SwarmRuntime(scripted_single_agent, None, RuntimeConfig(allow_subagents=False)).run(task)
    ts, t1 = parl_terms(swarm, _cfg(0.4, 0.2), 0), parl_terms(single, _cfg(0.4, 0.2), 0)
    assert (ts.r_parallel, ts.r_finish, ts.r_outcome) == (0.5, 1.0, 1.0)
    assert ts.total == pytest.approx(0.4 * 0.5 + 0.2 * 1.0 + 1.0)
    assert (t1.r_parallel, t1.r_finish, t1.r_outcome, t1.total) == (0.0, 0.0, 1.0, 1.0)
    late = parl_terms(swarm, _cfg(0.4, 0.2), 10)  # both lambdas annealed away: outcome only
    assert late.lambda1 == late.lambda2 == 0.0 and late.total == 1.0


def test_failed_subagents_lower_r_finish() -> None:
    def worker(messages):
        if "bad" in messages[-1]["content"]:
            raise RuntimeError("boom")
        return "Answer: 1"

    turn = format_turn("", [("create_subagent", {"name": "w", "system_prompt": "x"}),
                            *[("assign_task", {"agent": "w", "prompt": p}) for p in ("ok", "bad", "bad", "ok")]])
    orch = lambda m: turn if not any(x["role"] == "assistant" for x in m) else "Answer: 2"  # noqa: E731
    ep = SwarmRuntime(orch, worker).run(make_wide_task(0))
    t = parl_terms(ep, _cfg(1.0, 1.0), 0)
    assert t.r_parallel == 1.0 and t.r_finish == 0.5


def test_malformed_turn_earns_no_shaping_credit() -> None:
    """A turn cut off inside its second assign_task (the tiny model's early ``<|im_end|>``) still runs the first
    assignment, but PARL must not pay r_parallel / r_finish for it, else RL learns to cut turns ever shorter."""
    full = format_turn("", [("create_subagent", {"name": "w", "system_prompt": "x"}),
                            ("assign_task", {"agent": "w", "prompt": "How many red shapes are there in scenes 0?"}),
                            ("assign_task", {"agent": "w", "prompt": "How many red shapes are there in scenes 1?"})])
    cut = full[: full.rindex("functions.assign_task") + len("functions.assign_task")]
    for first, credited in ((cut, False), (full, True)):
        orch = lambda m, first=first: first if not any(x["role"] == "assistant" for x in m) else "Answer: 0"  # noqa: E731
        ep = SwarmRuntime(orch, scripted_worker).run(make_wide_task(0, n_scenes=2))
        ran = [r for st in ep.stages for r in st.runs]
        assert len(ran) == (2 if credited else 1) and all(r.finished for r in ran)  # the complete call still ran
        t = parl_terms(ep, _cfg(1.0, 1.0), 0)
        assert (t.r_parallel, t.r_finish) == ((0.5, 1.0) if credited else (0.0, 0.0))
