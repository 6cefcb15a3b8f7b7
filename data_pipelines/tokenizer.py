"""Tokenizer: byte-level BPE trained on the generated corpus, special tokens, chat template, loading.

Special tokens follow docs/INTERFACES.md ("Tokens and prompts", transformers' ``kimi_k25`` format):
media ``<|media_begin|>``, ``<|media_content|>``, ``<|media_pad|>``, ``<|media_end|>``,
``<|kimi_k25_video_placeholder|>``; chat ``<|im_system|>``, ``<|im_user|>``, ``<|im_assistant|>``,
``<|im_middle|>``, ``<|im_end|>``; tool calls ``<|tool_calls_section_begin|>``, ``<|tool_call_begin|>``,
``<|tool_call_argument_begin|>``, ``<|tool_call_end|>``, ``<|tool_calls_section_end|>``; plus
``<|endoftext|>`` (end of a pre-training document) and ``<|pad|>``.

Chat format (Kimi style), produced identically by the saved jinja template and by
:func:`render_chat` (which also says which characters are trainable)::

    <|im_system|>system<|im_middle|>...<|im_end|><|im_user|>user<|im_middle|>...<|im_end|>
    <|im_assistant|>assistant<|im_middle|>text<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:I
    <|tool_call_argument_begin|>{json}<|tool_call_end|><|tool_calls_section_end|><|im_end|>
    <|im_system|>tool<|im_middle|>result<|im_end|>

An image part renders as ``<|media_begin|>image<|media_content|><|media_pad|><|media_end|>`` with ONE pad;
a video part as ``<|media_begin|>video<|media_content|><|kimi_k25_video_placeholder|><|media_end|>``.
The packer expands each single placeholder to the exact vision-token count (and a video to one block per
chunk with its timestamp).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEDIA_TOKENS = ("<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>",
                "<|kimi_k25_video_placeholder|>")
CHAT_TOKENS = ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>")
TOOL_TOKENS = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
               "<|tool_call_end|>", "<|tool_calls_section_end|>")
EOS_TOKEN, PAD_TOKEN = "<|endoftext|>", "<|pad|>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN, *MEDIA_TOKENS, *CHAT_TOKENS, *TOOL_TOKENS)

IMAGE_PROMPT = "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>"
VIDEO_PROMPT = "<|media_begin|>video<|media_content|><|kimi_k25_video_placeholder|><|media_end|>"
ROLE_HEADERS = {"system": "<|im_system|>system<|im_middle|>", "user": "<|im_user|>user<|im_middle|>",
                "assistant": "<|im_assistant|>assistant<|im_middle|>", "tool": "<|im_system|>tool<|im_middle|>"}

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message.role == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif message.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- else -%}<|im_system|>tool<|im_middle|>{%- endif -%}"
    "{%- if message.content is string -%}{{ message.content }}"
    "{%- elif message.content -%}{%- for part in message.content -%}"
    "{%- if part.type == 'text' -%}{{ part.text }}"
    "{%- elif part.type == 'image' -%}" + IMAGE_PROMPT +
    "{%- elif part.type == 'video' -%}" + VIDEO_PROMPT +
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- if message.tool_calls -%}<|tool_calls_section_begin|>"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "<|tool_call_begin|>functions.{{ fn.name }}:{{ loop.index0 }}<|tool_call_argument_begin|>"
    "{%- if fn.arguments is string -%}{{ fn.arguments }}{%- else -%}{{ fn.arguments | tojson }}{%- endif -%}"
    "<|tool_call_end|>{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the special tokens the packer needs (chat/tool ids are -1 when the tokenizer lacks them)."""

    media_begin: int
    media_content: int
    media_pad: int
    media_end: int
    video_placeholder: int
    eos: int
    pad: int
    im_end: int


def _token_id(tokenizer: Any, token: str) -> int:
    """``token``'s id, or -1. A direct lookup where the tokenizer has one (``get_vocab()`` builds the whole vocabulary
    dict on every call: it was half of the packed loader's time, ~150 calls per 4 x 4096 batch)."""
    backend = getattr(tokenizer, "_tokenizer", tokenizer)  # transformers' fast tokenizers wrap a tokenizers.Tokenizer
    if hasattr(backend, "token_to_id"):
        tid = backend.token_to_id(token)
        return -1 if tid is None else int(tid)
    vocab = tokenizer.get_vocab()
    return int(vocab[token]) if token in vocab else -1


def special_ids(tokenizer: Any, where: str = "tokenizer") -> SpecialIds:
    """Resolve the special ids; raises ValueError naming any missing media token."""
    missing = [t for t in MEDIA_TOKENS if _token_id(tokenizer, t) < 0]
    if missing:
        raise ValueError(f"{where} lacks the media tokens {missing}; add them as special tokens "
                         f"(see docs/INTERFACES.md 'Tokens and prompts') or use `kimi-vl data tokenizer`")
    eos = _token_id(tokenizer, EOS_TOKEN)
    if eos < 0:
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else -1
    pad = _token_id(tokenizer, PAD_TOKEN)
    if pad < 0:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else max(eos, 0)
    ids = [_token_id(tokenizer, t) for t in MEDIA_TOKENS]
    return SpecialIds(*ids, eos=eos, pad=pad, im_end=_token_id(tokenizer, "<|im_end|>"))


PLACEHOLDER_TOKENS = ("<|media_pad|>", "<|kimi_k25_video_placeholder|>")


def placeholder_ids(tokenizer: Any) -> list[int]:
    """The ids of the media placeholders (a forward pass puts media features there, so a sampler must never draw
    them) that ``tokenizer`` has."""
    return [i for i in (_token_id(tokenizer, t) for t in PLACEHOLDER_TOKENS) if i >= 0]


def require_chat_tokens(tokenizer: Any, where: str = "tokenizer") -> None:
    missing = [t for t in (*CHAT_TOKENS, *TOOL_TOKENS) if _token_id(tokenizer, t) < 0]
    if missing:
        raise ValueError(f"{where} lacks the chat/tool tokens {missing} needed to render chat samples")


def train_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, vocab_size: int = 8192,
                    min_frequency: int = 2) -> Any:
    """Train byte-level BPE on ``texts``, add the special tokens and chat template, save to ``out_dir``
    as a transformers tokenizer directory; returns the loaded tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                   additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in
                                                              (EOS_TOKEN, PAD_TOKEN)])
    fast.chat_template = CHAT_TEMPLATE
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return load_tokenizer(out_dir)


def load_tokenizer(path: str | os.PathLike) -> Any:
    """Any local transformers tokenizer directory (ours or another one) that has the media tokens."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise FileNotFoundError(f"tokenizer directory does not exist: {path}")
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    special_ids(tokenizer, where=f"tokenizer at {path}")
    return tokenizer


def _content_parts(content: Any) -> list[tuple[str, int | None, str]]:
    """Message content -> ``(kind, media index, text)`` parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [("text", None, content)]
    out = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            out.append(("text", None, part["text"]))
        elif kind in ("image", "video"):
            out.append((kind, part.get("media"), ""))
        else:
            raise ValueError(f"unknown content part type {kind!r} in {part}")
    return out


def _tool_calls_text(calls: Sequence[dict[str, Any]]) -> str:
    pieces = ["<|tool_calls_section_begin|>"]
    for i, call in enumerate(calls):
        fn = call.get("function", call)
        args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
        pieces.append(f"<|tool_call_begin|>functions.{fn['name']}:{i}<|tool_call_argument_begin|>{args}"
                      "<|tool_call_end|>")
    return "".join(pieces) + "<|tool_calls_section_end|>"


def render_chat(messages: Sequence[dict[str, Any]], train_on: str = "assistant",
                add_generation_prompt: bool = False) -> list[tuple[str, bool, str | None]]:
    """The chat as ``(text, trainable, media)`` pieces whose concatenation equals the jinja template's
    output; ``media`` is ``"image"``/``"video"`` for a placeholder piece (one per media part, in order).

    ``train_on``: ``"assistant"`` (SFT: assistant content, tool calls and its ``<|im_end|>``),
    ``"all"`` (pre-training on chats: everything but media) or ``"none"``.
    """
    if train_on not in ("assistant", "all", "none"):
        raise ValueError(f"train_on must be 'assistant', 'all' or 'none', got {train_on!r}")
    pieces: list[tuple[str, bool, str | None]] = []
    for msg in messages:
        role = msg.get("role")
        if role not in ROLE_HEADERS:
            raise ValueError(f"unknown chat role {role!r}; expected one of {sorted(ROLE_HEADERS)}")
        body_trainable = train_on == "all" or (train_on == "assistant" and role == "assistant")
        pieces.append((ROLE_HEADERS[role], train_on == "all", None))
        for kind, _, text in _content_parts(msg.get("content")):
            if kind == "text":
                pieces.append((text, body_trainable, None))
            else:
                pieces.append((IMAGE_PROMPT if kind == "image" else VIDEO_PROMPT, False, kind))
        if msg.get("tool_calls"):
            pieces.append((_tool_calls_text(msg["tool_calls"]), body_trainable, None))
        pieces.append(("<|im_end|>", body_trainable, None))
    if add_generation_prompt:
        pieces.append((ROLE_HEADERS["assistant"], False, None))
    return pieces


def iter_corpus_texts(shards: Sequence[str], extra: Iterable[str] = ()) -> Iterable[str]:
    """Training text for the tokenizer: each sample's ``txt`` and its rendered chat, then ``extra``."""
    from data_pipelines.shards import iter_tar

    for shard in shards:
        for raw in iter_tar(shard):
            if "txt" in raw:
                yield raw["txt"].decode("utf-8", errors="replace")
            if "json" in raw:
                messages = json.loads(raw["json"]).get("messages")
                if messages:
                    yield "".join(p[0] for p in render_chat(messages, train_on="none"))
    yield from extra
