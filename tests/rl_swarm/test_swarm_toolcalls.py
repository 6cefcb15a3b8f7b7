"""Tool-call parser: well-formed turns round-trip with the chat template; every malformation is an error, never
an exception."""

from __future__ import annotations

import random

import pytest

from data_pipelines.tokenizer import render_chat
from rl.swarm.toolcalls import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    MARKERS,
    SECTION_BEGIN,
    SECTION_END,
    describe_errors,
    format_tool_calls,
    format_turn,
    parse_assistant_turn,
)


def _call(name: str, args: str) -> str:
    return f"{CALL_BEGIN}{name}{ARG_BEGIN}{args}{CALL_END}"


def _section(*calls: str) -> str:
    return SECTION_BEGIN + "".join(calls) + SECTION_END


def test_format_matches_chat_template() -> None:
    calls = [("create_subagent", {"name": "w", "system_prompt": "count"}),
             ("assign_task", {"agent": "w", "prompt": "p"})]
    msg = {"role": "assistant", "content": "plan", "tool_calls": [{"name": n, "arguments": a} for n, a in calls]}
    rendered = "".join(p[0] for p in render_chat([msg], train_on="none"))
    body = rendered.split("<|im_middle|>", 1)[1].removesuffix("<|im_end|>")
    assert body == format_turn("plan", calls)


def test_well_formed_round_trip() -> None:
    calls = [("read_scene", {"index": 3}), ("assign_task", {"agent": "a", "prompt": "x \"quoted\" {braces}"}),
             ("answer", {})]  # fmt: skip
    parsed = parse_assistant_turn(format_turn("thinking...", calls))
    assert parsed.ok and parsed.has_section
    assert parsed.content == "thinking..."
    assert [(c.name, c.arguments, c.index) for c in parsed.calls] == [(n, a, i) for i, (n, a) in enumerate(calls)]


def test_plain_text_turn_has_no_calls() -> None:
    parsed = parse_assistant_turn("Answer: 12")
    assert parsed.ok and not parsed.calls and not parsed.has_section and parsed.content == "Answer: 12"


@pytest.mark.parametrize("name", ["read_scene", "functions.read_scene", "read_scene:7", "functions.read_scene:0",
                                  "  functions.read_scene:2 "])  # fmt: skip
def test_call_id_forms(name: str) -> None:
    parsed = parse_assistant_turn(_section(_call(name, '{"index": 1}')))
    assert parsed.ok and parsed.calls[0].name == "read_scene"


MALFORMED = {
    "invalid_json": _section(_call("functions.read_scene:0", '{"index": 1')),
    "json_list": _section(_call("functions.read_scene:0", "[1, 2]")),
    "json_number": _section(_call("functions.read_scene:0", "3")),
    "json_string": _section(_call("functions.read_scene:0", '"x"')),
    "trailing_garbage": _section(_call("functions.read_scene:0", '{"index": 1} extra')),
    "bad_name_space": _section(_call("functions.read scene:0", "{}")),
    "bad_name_empty": _section(_call("", "{}")),
    "bad_name_digit": _section(_call("functions.3d:0", "{}")),
    "bad_index": _section(_call("functions.read_scene:x", "{}")),
    "no_arg_marker": SECTION_BEGIN + CALL_BEGIN + "functions.read_scene:0" + CALL_END + SECTION_END,
    "cut_off_in_args": SECTION_BEGIN + CALL_BEGIN + "functions.read_scene:0" + ARG_BEGIN + '{"ind',
    "cut_off_in_name": SECTION_BEGIN + CALL_BEGIN + "functions.rea",
    "section_not_closed": SECTION_BEGIN + _call("read_scene", "{}"),
    "nested_call": SECTION_BEGIN + CALL_BEGIN + "a" + ARG_BEGIN + "{}" + _call("b", "{}") + SECTION_END,
    "stray_call_end": "text" + CALL_END,
    "stray_arg_begin": SECTION_BEGIN + ARG_BEGIN + "{}" + SECTION_END,
    "call_outside_section": _call("read_scene", "{}"),
    "section_end_only": "hello" + SECTION_END,
    "two_sections": _section(_call("a", "{}")) + _section(_call("b", "{}")),
    "text_between_calls": _section(_call("a", "{}"), "and then", _call("b", "{}")),
    "double_arg_begin": SECTION_BEGIN + CALL_BEGIN + "a" + ARG_BEGIN + "{}" + ARG_BEGIN + "{}" + CALL_END + SECTION_END,
    "section_in_section": SECTION_BEGIN + SECTION_BEGIN + _call("a", "{}") + SECTION_END,
    "only_markers": "".join(MARKERS[::-1]),
    "deep_json": _section(_call("a", "[" * 5000 + "]" * 5000)),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_is_an_error_not_a_crash(case: str) -> None:
    parsed = parse_assistant_turn(MALFORMED[case])
    assert not parsed.ok, case
    assert describe_errors(parsed.errors)  # every error renders to an observation


def test_complete_calls_survive_a_truncated_one() -> None:
    text = SECTION_BEGIN + _call("functions.read_scene:0", '{"index": 0}') + CALL_BEGIN + "functions.read_scene:1"
    parsed = parse_assistant_turn(text + ARG_BEGIN + '{"in')
    assert [c.arguments for c in parsed.calls] == [{"index": 0}]
    assert [e.index for e in parsed.errors] == [1, -1]  # the cut call, then the unclosed section


def test_error_indices_follow_call_positions() -> None:
    parsed = parse_assistant_turn(_section(_call("a", "{}"), _call("b", "nope"), _call("c", '{"k": 1}')))
    assert [c.index for c in parsed.calls] == [0, 2]
    assert [e.index for e in parsed.errors] == [1]
    assert "not valid JSON" in parsed.errors[0].message


def test_random_marker_soup_never_raises() -> None:
    rng = random.Random(0)
    atoms = [*MARKERS, "functions.x:0", "{", "}", '{"a": 1}', "text", " ", "<|im_end|>", "\u00e9", "\n"]
    for _ in range(2000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 12)))
        parsed = parse_assistant_turn(text)
        assert all(isinstance(c.arguments, dict) for c in parsed.calls)


def test_non_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be str"):
        parse_assistant_turn(None)  # type: ignore[arg-type]


def test_format_empty() -> None:
    assert format_tool_calls([]) == ""
