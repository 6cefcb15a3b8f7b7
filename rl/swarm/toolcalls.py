"""Tool calls in the project's chat format: parse an assistant turn into calls (never raising), and format calls.

The format is the one :mod:`data_pipelines.tokenizer` renders (docs/INTERFACES.md "Tokens and prompts")::

    free text<|tool_calls_section_begin|>
    <|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{"json": "object"}<|tool_call_end|>
    <|tool_call_begin|>functions.NAME:1<|tool_call_argument_begin|>{...}<|tool_call_end|>
    <|tool_calls_section_end|>

:func:`parse_assistant_turn` returns the free text, the well-formed calls and one :class:`CallError` per
malformation. A generated turn is untrusted text, so every defect is reported, none raises:

- a call id is ``NAME``, ``functions.NAME`` or either with ``:INDEX``; ``NAME`` must be an identifier;
- arguments must be one JSON object (``{}`` allowed); invalid JSON, a list, a number -> error;
- a call that is not closed (no ``<|tool_call_end|>``, e.g. the generation ran out of tokens), a call with no
  ``<|tool_call_argument_begin|>``, a call opened inside another call, a section that is never closed, a second
  section, tool markers outside a section, and non-blank text between calls are errors;
- whatever is well formed is still returned (a truncated last call does not void the complete ones before it).

Whether a *well-formed* call names a known tool with valid arguments is the runtime's business
(:mod:`rl.swarm.runtime`), which turns those defects into error observations too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END)

_SPLIT = re.compile("(" + "|".join(re.escape(m) for m in MARKERS) + ")")
_CALL_ID = re.compile(r"^(?:functions\.)?([A-Za-z_][A-Za-z0-9_]*)(?::(\d+))?$")


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: ``name`` (without ``functions.``), its JSON-object ``arguments`` and its position."""

    name: str
    arguments: dict[str, Any]
    index: int  # position among the turn's calls (well-formed and malformed), from 0


@dataclass(frozen=True)
class CallError:
    """One malformation; ``raw`` is the offending text (shortened)."""

    index: int  # call position it belongs to, or -1 for section-level defects
    message: str
    raw: str = ""


@dataclass
class ParsedTurn:
    content: str  # the free text before the section (and after it, if any)
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[CallError] = field(default_factory=list)
    has_section: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _parse_call_id(raw: str) -> str | None:
    m = _CALL_ID.match(raw.strip())
    return m.group(1) if m else None


def _parse_arguments(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)`` or ``(None, error message)``."""
    text = raw.strip()
    if not text:
        return {}, None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        return None, f"arguments are not valid JSON ({exc.__class__.__name__}: {str(exc)[:60]})"
    if not isinstance(value, dict):
        return None, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


class _Parser:
    """A small state machine over the marker-split pieces of one turn."""

    def __init__(self) -> None:
        self.out = ParsedTurn(content="")
        self.content: list[str] = []
        self.state = "text"  # text | section | name | args | after
        self.n_calls = 0
        self.name_raw, self.args_raw = "", ""

    def error(self, message: str, raw: str = "", index: int | None = None) -> None:
        self.out.errors.append(CallError(self.n_calls if index is None else index, message, _short(raw)))

    def close_call(self) -> None:
        name = _parse_call_id(self.name_raw)
        args, why = _parse_arguments(self.args_raw)
        if name is None:
            self.error(f"bad tool name {self.name_raw.strip()!r} (expected functions.NAME:INDEX)", self.name_raw)
        elif args is None:
            self.error(f"call to '{name}': {why}", self.args_raw)
        else:
            self.out.calls.append(ToolCall(name, args, self.n_calls))
        self.n_calls += 1
        self.name_raw, self.args_raw = "", ""

    def abandon_call(self, message: str) -> None:
        self.error(message, self.name_raw + self.args_raw)
        self.n_calls += 1
        self.name_raw, self.args_raw = "", ""

    def feed(self, piece: str) -> None:
        handler = getattr(self, f"_in_{self.state}")
        handler(piece)

    def _in_text(self, piece: str) -> None:
        if piece == SECTION_BEGIN:
            self.state, self.out.has_section = "section", True
        elif piece in MARKERS:
            self.error(f"{piece} outside a tool-call section", piece, index=-1)
        else:
            self.content.append(piece)

    def _in_after(self, piece: str) -> None:
        if piece == SECTION_BEGIN:
            self.error("a second tool-call section (only one per turn)", piece, index=-1)
            self.state = "section"
        elif piece in MARKERS:
            self.error(f"{piece} outside a tool-call section", piece, index=-1)
        else:
            self.content.append(piece)

    def _in_section(self, piece: str) -> None:
        if piece == CALL_BEGIN:
            self.state = "name"
        elif piece == SECTION_END:
            self.state = "after"
        elif piece in (ARG_BEGIN, CALL_END, SECTION_BEGIN):
            self.error(f"{piece} without an open <|tool_call_begin|>", piece, index=-1)
        elif piece.strip():
            self.error("text between tool calls", piece, index=-1)

    def _in_name(self, piece: str) -> None:
        if piece == ARG_BEGIN:
            self.state = "args"
        elif piece in MARKERS:
            self.abandon_call(f"tool call without <|tool_call_argument_begin|> (got {piece})")
            self._reenter(piece)
        else:
            self.name_raw += piece

    def _in_args(self, piece: str) -> None:
        if piece == CALL_END:
            self.close_call()
            self.state = "section"
        elif piece in MARKERS:
            self.abandon_call(f"tool call not closed with <|tool_call_end|> (got {piece})")
            self._reenter(piece)
        else:
            self.args_raw += piece

    def _reenter(self, piece: str) -> None:
        """After abandoning a call, treat the marker that broke it as if seen inside the section."""
        self.state = "section"
        if piece == ARG_BEGIN:
            self.error(f"{piece} without an open <|tool_call_begin|>", piece, index=-1)
        else:
            self._in_section(piece)

    def finish(self) -> ParsedTurn:
        if self.state in ("name", "args"):
            self.abandon_call("tool call cut off before <|tool_call_end|>")
            self.state = "section"
        if self.state == "section":
            self.error("tool-call section not closed with <|tool_calls_section_end|>", index=-1)
        self.out.content = "".join(self.content).strip()
        return self.out


def parse_assistant_turn(text: str) -> ParsedTurn:
    """Split one assistant turn (decoded with special tokens kept) into free text, calls and errors.

    Never raises on malformed input (a non-``str`` argument is a programming error and raises ``TypeError``).
    A trailing ``<|im_end|>`` should be stripped by the caller; any other text is free content."""
    if not isinstance(text, str):
        raise TypeError(f"parse_assistant_turn: text must be str, got {type(text).__name__}")
    parser = _Parser()
    for piece in _SPLIT.split(text):
        if piece:
            parser.feed(piece)
    return parser.finish()


def format_tool_calls(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """``[(name, arguments), ...]`` -> the tool-call section exactly as the chat template renders it
    (``functions.NAME:I``, ``json.dumps`` arguments); ``""`` for no calls."""
    if not calls:
        return ""
    body = "".join(
        f"{CALL_BEGIN}functions.{name}:{i}{ARG_BEGIN}{json.dumps(dict(args))}{CALL_END}"
        for i, (name, args) in enumerate(calls)
    )
    return SECTION_BEGIN + body + SECTION_END


def format_turn(content: str, calls: Sequence[tuple[str, Mapping[str, Any]]] = ()) -> str:
    """An assistant turn's text: free ``content`` then the tool-call section."""
    return content + format_tool_calls(calls)


def describe_errors(errors: Sequence[CallError]) -> str:
    """One observation line per error, for the model to read."""
    return "\n".join(f"error in tool call {e.index}: {e.message}" if e.index >= 0 else f"error: {e.message}"
                     for e in errors)  # fmt: skip


__all__ = [
    "ARG_BEGIN",
    "CALL_BEGIN",
    "CALL_END",
    "CallError",
    "MARKERS",
    "ParsedTurn",
    "SECTION_BEGIN",
    "SECTION_END",
    "ToolCall",
    "describe_errors",
    "format_tool_calls",
    "format_turn",
    "parse_assistant_turn",
]
