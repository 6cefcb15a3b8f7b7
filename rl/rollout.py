"""Rollout engine: K sampled responses per prompt through the model's cached generation, with the
log-probability of every sampled token recorded at sampling time.

The loop is our own (not ``generate()``) so the recorded log-probs are exactly the ones the sampler
used: one prefill of the prompt (with its images / video), then one-token decode steps through
``model(input_ids=tok, past_key_values=cache, use_cache=True)`` - the KDA recurrent + conv state and
the MLA latent cache live in whatever cache object the model returns. The K responses of one prompt
are one batch of K identical prompt rows, so prompts need no padding; a finished row keeps decoding a
pad token whose outputs are discarded (rows never interact, so the others are unaffected).

Log-probs are ``log softmax(logits / temperature)`` of the sampled token - the tempered policy that
the trainer also scores (:func:`recompute_logprobs`); top-p only restricts which tokens are drawn.

Shapes: K responses per prompt, S prompt tokens, T response tokens (right-padded to the longest
response of the group), V vocabulary. ``media`` is the packed-batch media dict of INTERFACES.md
(``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw``) for one prompt row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

MEDIA_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    stop_strings: list[str] = field(default_factory=list)
    use_cache: bool = True  # False: re-run the whole sequence every step (the reference path)

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"SamplingConfig.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Prompt:
    """One verifiable task: tokenised prompt, its media, and how to score a response."""

    input_ids: list[int]
    family: str
    answer: Any
    media: dict[str, torch.Tensor] = field(default_factory=dict)
    reward_options: dict[str, Any] = field(default_factory=dict)
    uid: str = ""


@dataclass
class Group:
    """K responses to one prompt. ``response_ids_KT`` is padded with ``pad_id`` where ``mask_KT`` is 0."""

    prompt: Prompt
    response_ids_KT: torch.Tensor  # [K, T] long
    logprobs_KT: torch.Tensor  # [K, T] fp32, 0 on padding
    mask_KT: torch.Tensor  # [K, T] fp32, 1 on response tokens
    texts: list[str]  # decoded responses (up to and including a stop string)
    finish: list[str]  # "eos" | "stop" | "length"

    @property
    def lengths(self) -> torch.Tensor:  # [K]
        return self.mask_KT.sum(1).long()


def repeat_media(media: Mapping[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Media of one prompt row -> media of ``k`` identical rows (packed patches and grids concatenated)."""
    out = {}
    for key, value in media.items():
        if key not in MEDIA_KEYS:
            raise ValueError(f"repeat_media: unknown media key '{key}' (known: {MEDIA_KEYS})")
        out[key] = torch.cat([value] * k, dim=0)
    return out


def top_p_filter(logprobs_KV: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches ``top_p`` (the top token always);
    others get -inf. Input/output ``[K, V]`` log-probs (the output is not renormalised)."""
    if top_p >= 1.0:
        return logprobs_KV
    sorted_lp, order = logprobs_KV.sort(dim=-1, descending=True)
    mass_before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logprobs_KV.masked_fill(drop, float("-inf"))


def sample_tokens(
    logits_KV: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return (tokens ``[K]``, their log-probs under softmax(logits / T) ``[K]``)."""
    logprobs = torch.log_softmax(logits_KV.float() / cfg.temperature, dim=-1)
    filtered = top_p_filter(logprobs, cfg.top_p)
    probs = torch.softmax(filtered, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def _forward(model: Any, input_ids: torch.Tensor, media: Mapping[str, torch.Tensor], past: Any, use_cache: bool):
    kwargs = dict(media)
    if use_cache:
        kwargs.update(past_key_values=past, use_cache=True)
    else:
        kwargs["use_cache"] = False
    return model(input_ids=input_ids, **kwargs)


class _StopWatch:
    """Tracks per-row termination: EOS ids, stop strings (checked on the decoded text), length."""

    def __init__(self, k: int, eos_ids: Sequence[int], stops: Sequence[str], decode: Callable[[list[int]], str]):
        self.eos_ids, self.stops, self.decode = set(eos_ids), list(stops), decode
        self.done = [False] * k
        self.finish = ["length"] * k

    def update(self, row: int, ids: list[int]) -> None:
        if ids[-1] in self.eos_ids:
            self.done[row], self.finish[row] = True, "eos"
        elif self.stops and any(s in self.decode(ids) for s in self.stops):
            self.done[row], self.finish[row] = True, "stop"


def sample_group(
    model: Any,
    prompt: Prompt,
    k: int,
    cfg: SamplingConfig,
    eos_ids: Sequence[int],
    pad_id: int,
    decode: Callable[[list[int]], str],
    generator: torch.Generator | None = None,
) -> Group:
    """Sample ``k`` responses to one prompt (see :func:`sample_groups`)."""
    return sample_groups(model, [prompt], k, cfg, eos_ids, pad_id, decode, generator)[0]


def sample_groups(
    model: Any,
    prompts: Sequence[Prompt],
    k: int,
    cfg: SamplingConfig,
    eos_ids: Sequence[int],
    pad_id: int,
    decode: Callable[[list[int]], str],
    generator: torch.Generator | None = None,
) -> list[Group]:
    """Sample ``k`` responses to each prompt; prompts of equal length share one batch of ``n * k`` rows (no
    padding needed). ``decode(ids) -> str`` turns response ids into text for stop strings and rewards;
    ``eos_ids`` end a response (the EOS token is kept and scored). Groups come back in prompt order."""
    for i, p in enumerate(prompts):
        if not p.input_ids:
            raise ValueError(f"sample_groups: prompts[{i}].input_ids is empty")
    buckets: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        buckets.setdefault(len(p.input_ids), []).append(i)
    out: list[Group | None] = [None] * len(prompts)
    for idx in buckets.values():
        groups = _sample_bucket(model, [prompts[i] for i in idx], k, cfg, eos_ids, pad_id, decode, generator)
        for i, g in zip(idx, groups):
            out[i] = g
    return out  # type: ignore[return-value]


def batch_media(media_list: Sequence[Mapping[str, torch.Tensor]], k: int) -> dict[str, torch.Tensor]:
    """Media of several prompts, each repeated ``k`` times, in row order (one packed media dict)."""
    parts = [repeat_media(m, k) for m in media_list]
    keys = {key for m in parts for key in m}
    return {key: torch.cat([m[key] for m in parts if key in m], dim=0) for key in sorted(keys)}


@torch.no_grad()
def _sample_bucket(
    model: Any,
    prompts: Sequence[Prompt],
    k: int,
    cfg: SamplingConfig,
    eos_ids: Sequence[int],
    pad_id: int,
    decode: Callable[[list[int]], str],
    generator: torch.Generator | None,
) -> list[Group]:
    device = next(model.parameters()).device
    rows = [p.input_ids for p in prompts for _ in range(k)]
    prompt_RS = torch.tensor(rows, dtype=torch.long, device=device)  # R = len(prompts) * k rows
    media = {key: v.to(device) for key, v in batch_media([p.media for p in prompts], k).items()}
    watch = _StopWatch(len(rows), eos_ids, cfg.stop_strings, decode)
    out = _forward(model, prompt_RS, media, None, cfg.use_cache)
    past, seq = out.past_key_values if cfg.use_cache else None, prompt_RS
    tokens, logps = [], []
    for _ in range(cfg.max_new_tokens):
        tok, lp = sample_tokens(out.logits[:, -1], cfg, generator)
        live = torch.tensor([not d for d in watch.done], device=device)
        tok = torch.where(live, tok, torch.full_like(tok, pad_id))
        tokens.append(tok)
        logps.append(torch.where(live, lp, torch.zeros_like(lp)))
        cols = torch.stack(tokens, 1).tolist()
        for row in range(len(rows)):
            if live[row]:
                watch.update(row, cols[row])
        if all(watch.done):
            break
        seq = torch.cat([seq, tok[:, None]], dim=1)
        if cfg.use_cache:
            out = _forward(model, tok[:, None], {}, past, True)
            past = out.past_key_values
        else:
            out = _forward(model, seq, media, None, False)
    ids_RT, logp_RT = torch.stack(tokens, 1), torch.stack(logps, 1)
    return [_finish_group(p, ids_RT[i * k : (i + 1) * k], logp_RT[i * k : (i + 1) * k], watch, i * k, pad_id, decode)
            for i, p in enumerate(prompts)]  # fmt: skip


def _finish_group(
    prompt: Prompt,
    ids_KT: torch.Tensor,
    logp_KT: torch.Tensor,
    watch: _StopWatch,
    row0: int,
    pad_id: int,
    decode: Callable,
) -> Group:
    k, t = ids_KT.shape
    lengths = []
    for row in range(k):
        ids = ids_KT[row].tolist()
        n = t
        if watch.finish[row0 + row] != "length":
            n = next(i for i in range(1, t + 1) if _ends_here(ids[:i], watch))
        lengths.append(n)
    mask = torch.arange(t, device=ids_KT.device)[None, :] < torch.tensor(lengths, device=ids_KT.device)[:, None]
    ids_KT = torch.where(mask, ids_KT, torch.full_like(ids_KT, pad_id)).cpu()
    texts = [decode(ids_KT[row, : lengths[row]].tolist()) for row in range(k)]
    finish = watch.finish[row0 : row0 + k]
    return Group(prompt, ids_KT, (logp_KT * mask).float().cpu(), mask.float().cpu(), texts, finish)


def _ends_here(ids: list[int], watch: _StopWatch) -> bool:
    return ids[-1] in watch.eos_ids or bool(watch.stops and any(s in watch.decode(ids) for s in watch.stops))


def recompute_logprobs(
    model: Any,
    prompt_ids: Sequence[int] | torch.Tensor,
    response_ids_RT: torch.Tensor,
    media: Mapping[str, torch.Tensor],
    temperature: float = 1.0,
    with_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One full forward over ``prompt + response`` rows; log softmax(logits / T) of each response token.

    ``prompt_ids`` is one prompt (a list, used for every row; ``media`` then belongs to that one prompt and is
    repeated per row) or a ``[R, S]`` tensor of prompt rows (``media`` then already holds every row's media in
    row order, see :func:`batch_media`). Returns log-probs ``[R, T]`` (differentiable if grad is on) and, if
    ``with_logits``, the tempered response logits ``[R, T, V]`` (for the entropy metric)."""
    device = next(model.parameters()).device
    r, t = response_ids_RT.shape
    if isinstance(prompt_ids, torch.Tensor):
        prompt_RS, rep = prompt_ids.to(device), {key: v.to(device) for key, v in media.items()}
    else:
        prompt_RS = torch.tensor([list(prompt_ids)] * r, dtype=torch.long, device=device)
        rep = {key: v.to(device) for key, v in repeat_media(media, r).items()}
    if prompt_RS.shape[0] != r:
        raise ValueError(f"recompute_logprobs: {prompt_RS.shape[0]} prompt rows for {r} response rows")
    ids = torch.cat([prompt_RS, response_ids_RT.to(device)], dim=1)  # [R, S + T]
    logits = model(input_ids=ids, use_cache=False, **rep).logits  # [R, S + T, V]
    s = prompt_RS.shape[1]
    resp_logits = logits[:, s - 1 : s - 1 + t].float() / temperature  # position i predicts token i + 1
    logp = torch.log_softmax(resp_logits, dim=-1).gather(2, response_ids_RT.to(device)[..., None]).squeeze(-1)
    return logp, (resp_logits if with_logits else None)


__all__ = [
    "Group",
    "Prompt",
    "batch_media",
    "SamplingConfig",
    "recompute_logprobs",
    "repeat_media",
    "sample_group",
    "sample_groups",
    "sample_tokens",
    "top_p_filter",
]
