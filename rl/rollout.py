"""Rollout engine: K sampled responses per prompt through the model's cached generation, with the
log-probability of every sampled token recorded at sampling time.

The loop is our own (not ``generate()``) so the recorded log-probs are exactly the ones the sampler used: one
prefill of the prompts (with their images / video), then one-token decode steps through ``model(input_ids=tok,
attention_mask=..., cache=cache, use_cache=True)`` (``past_key_values=`` before transformers 5.2x) - the KDA
recurrent + conv state and the MLA latent cache live in whatever cache object the model returns. All prompts of a
call (K rows each) decode as one batch, or as batches of at most ``SamplingConfig.max_rows`` rows (a prompt's K rows
stay together; prompts are sorted by length first so a batch holds similar lengths). Prompts of different lengths
are left-padded with an attention mask (the model zeroes padded positions for KDA and masks them for MLA, so a row's
outputs equal its unpadded ones); a batch of equal lengths gets no mask. A finished row keeps decoding a pad token
whose outputs are discarded (rows never interact).

Random numbers: one ``torch.multinomial`` draw per decode step over the batch's rows, in batch row order.
The same seed, prompts and ``max_rows`` give the same samples; a different batching (``max_rows``) draws
the same prompt's tokens from different random numbers (the distribution is the same).

Log-probs are ``log softmax(logits / temperature)`` of the sampled token - the tempered policy that
the trainer also scores (:func:`recompute_logprobs`); top-p and ``banned_ids`` (tokens never drawn: the media
placeholders, which a forward pass would expect media for) only restrict which tokens are drawn.

Shapes: K responses per prompt, R rows of a batch, S prompt tokens (left-padded to the batch's longest),
T response tokens (right-padded to the longest response of the group), V vocabulary. ``media`` is the
packed-batch media dict of INTERFACES.md (``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``,
``video_grid_thw``) for one prompt row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from data_pipelines.packing import left_pad
from kimi_vl.modeling.cache import CACHE_FIELD, output_cache
from kimi_vl.modeling.multimodal import MEDIA_KEYS


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    stop_strings: list[str] = field(default_factory=list)
    use_cache: bool = True  # False: re-run the whole sequence every step (the reference path)
    max_rows: int = 0  # rows (prompts x K) per decode batch; 0: every prompt of the call in one batch

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"SamplingConfig.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_rows < 0:
            raise ValueError(f"SamplingConfig.max_rows must be >= 0 (0: no limit), got {self.max_rows}")


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
    logits_KV: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None,
    banned_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row, never one of ``banned_ids`` (top-p then keeps the nucleus of the allowed tokens);
    return (tokens ``[K]``, their log-probs under softmax(logits / T) ``[K]``)."""
    logprobs = torch.log_softmax(logits_KV.float() / cfg.temperature, dim=-1)
    allowed = logprobs
    if banned_ids is not None and banned_ids.numel():  # before top-p: its nucleus is taken among allowed tokens
        allowed = torch.log_softmax(logprobs.index_fill(1, banned_ids, float("-inf")), dim=-1)
    probs = torch.softmax(top_p_filter(allowed, cfg.top_p), dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def _forward(
    model: Any,
    input_ids: torch.Tensor,
    media: Mapping[str, torch.Tensor],
    attention_mask: torch.Tensor | None,
    past: Any,
    use_cache: bool,
    logits_to_keep: int = 0,
):
    kwargs = dict(media)
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    if logits_to_keep:
        kwargs["logits_to_keep"] = logits_to_keep
    if use_cache:
        kwargs.update({CACHE_FIELD: past, "use_cache": True})  # the name this transformers' models take
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
    banned_ids: Sequence[int] = (),
) -> Group:
    """Sample ``k`` responses to one prompt (see :func:`sample_groups`)."""
    return sample_groups(model, [prompt], k, cfg, eos_ids, pad_id, decode, generator, banned_ids)[0]


def sample_groups(
    model: Any,
    prompts: Sequence[Prompt],
    k: int,
    cfg: SamplingConfig,
    eos_ids: Sequence[int],
    pad_id: int,
    decode: Callable[[list[int]], str],
    generator: torch.Generator | None = None,
    banned_ids: Sequence[int] = (),
) -> list[Group]:
    """Sample ``k`` responses to each prompt; all prompts share one left-padded batch of ``n * k`` rows (or
    batches of at most ``cfg.max_rows`` rows, see the module docstring). ``decode(ids) -> str`` turns response
    ids into text for stop strings and rewards; ``eos_ids`` end a response (the EOS token is kept and scored);
    ``banned_ids`` are never drawn. Groups come back in prompt order."""
    for i, p in enumerate(prompts):
        if not p.input_ids:
            raise ValueError(f"sample_groups: prompts[{i}].input_ids is empty")
    out: list[Group | None] = [None] * len(prompts)
    for idx in prompt_batches([len(p.input_ids) for p in prompts], k, cfg.max_rows):
        groups = _sample_batch(model, [prompts[i] for i in idx], k, cfg, eos_ids, pad_id, decode, generator,
                               banned_ids)
        for i, g in zip(idx, groups):
            out[i] = g
    return out  # type: ignore[return-value]


def prompt_batches(lengths: Sequence[int], rows_per_item: int, max_rows: int) -> list[list[int]]:
    """Split items (prompts of ``rows_per_item`` rows each, or single rows with 1) into batches of at most
    ``max_rows`` rows (0: one batch; an item is never split, so a batch has at least one item), after a stable
    sort by ``lengths`` so that each batch holds similar lengths (less padding). Returns item indices per batch."""
    if max_rows < 0 or rows_per_item < 1:
        raise ValueError(f"prompt_batches: need max_rows >= 0 and rows_per_item >= 1, got {max_rows}, {rows_per_item}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    per = len(order) if max_rows == 0 else max(1, max_rows // rows_per_item)
    return [order[i : i + per] for i in range(0, len(order), max(per, 1))]


def batch_media(media_list: Sequence[Mapping[str, torch.Tensor]], k: int) -> dict[str, torch.Tensor]:
    """Media of several prompts, each repeated ``k`` times, in row order (one packed media dict)."""
    parts = [repeat_media(m, k) for m in media_list]
    keys = {key for m in parts for key in m}
    return {key: torch.cat([m[key] for m in parts if key in m], dim=0) for key in sorted(keys)}


@torch.no_grad()
def _sample_batch(
    model: Any,
    prompts: Sequence[Prompt],
    k: int,
    cfg: SamplingConfig,
    eos_ids: Sequence[int],
    pad_id: int,
    decode: Callable[[list[int]], str],
    generator: torch.Generator | None,
    banned_ids: Sequence[int] = (),
) -> list[Group]:
    device = next(model.parameters()).device
    banned = torch.tensor(sorted(set(banned_ids)), dtype=torch.long, device=device)
    logits_RV, past, seq, attn_RS, media = _prefill(model, prompts, k, pad_id, cfg.use_cache, device)
    r = seq.shape[0]  # len(prompts) * k rows
    watch = _StopWatch(r, eos_ids, cfg.stop_strings, decode)
    tokens, logps = [], []
    for _ in range(cfg.max_new_tokens):
        tok, lp = sample_tokens(logits_RV, cfg, generator, banned)
        live = torch.tensor([not d for d in watch.done], device=device)
        tok = torch.where(live, tok, torch.full_like(tok, pad_id))
        tokens.append(tok)
        logps.append(torch.where(live, lp, torch.zeros_like(lp)))
        cols = torch.stack(tokens, 1).tolist()
        for row in range(r):
            if live[row]:
                watch.update(row, cols[row])
        if all(watch.done):
            break
        seq = torch.cat([seq, tok[:, None]], dim=1)
        if attn_RS is not None:  # generated tokens (a finished row's pads too: discarded anyway) are visible
            attn_RS = torch.cat([attn_RS, attn_RS.new_ones(r, 1)], dim=1)
        if cfg.use_cache:
            out = _forward(model, tok[:, None], {}, attn_RS, past, True)
            past = output_cache(out)
        else:
            out = _forward(model, seq, media, attn_RS, None, False, logits_to_keep=1)
        logits_RV = out.logits[:, -1]
    ids_RT, logp_RT = torch.stack(tokens, 1), torch.stack(logps, 1)
    return [_finish_group(p, ids_RT[i * k : (i + 1) * k], logp_RT[i * k : (i + 1) * k], watch, i * k, pad_id, decode)
            for i, p in enumerate(prompts)]  # fmt: skip


def _prefill(model: Any, prompts: Sequence[Prompt], k: int, pad_id: int, use_cache: bool, device: torch.device
             ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:  # fmt: skip
    """The prompt forward of a batch: last-position logits ``[R, V]``, the cache (None without ``use_cache``),
    the prompt rows ``[R, S]``, their attention mask (None without padding) and the rows' media.

    With the cache, each prompt is run once and its cache rows are repeated K times through the cache's
    ``reorder_cache`` (the row-selection API of beam search): a prompt's K rows are identical, so this is the
    same prefill - vision tower included - at 1/K of the work. A cache without ``reorder_cache`` gets the plain
    K-row prefill."""
    prompt_RS, attn_RS = left_pad([p.input_ids for p in prompts for _ in range(k)], pad_id, device)
    if use_cache and k > 1:
        prompt_PS, attn_PS = left_pad([p.input_ids for p in prompts], pad_id, device)
        media_P = {key: v.to(device) for key, v in batch_media([p.media for p in prompts], 1).items()}
        out = _forward(model, prompt_PS, media_P, attn_PS, None, True, logits_to_keep=1)
        cache = output_cache(out)
        if hasattr(cache, "reorder_cache"):
            index = torch.arange(len(prompts), device=device).repeat_interleave(k)
            cache.reorder_cache(index)
            return out.logits[index, -1], cache, prompt_RS, attn_RS, {}
    media = {key: v.to(device) for key, v in batch_media([p.media for p in prompts], k).items()}
    out = _forward(model, prompt_RS, media, attn_RS, None, use_cache, logits_to_keep=1)
    return out.logits[:, -1], output_cache(out) if use_cache else None, prompt_RS, attn_RS, media


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
    t = max(lengths)  # the batch decoded until its longest response: cut to this group's longest
    ids_KT, logp_KT = ids_KT[:, :t], logp_KT[:, :t]
    mask = torch.arange(t, device=ids_KT.device)[None, :] < torch.tensor(lengths, device=ids_KT.device)[:, None]
    ids_KT = torch.where(mask, ids_KT, torch.full_like(ids_KT, pad_id)).cpu()
    texts = [decode(ids_KT[row, : lengths[row]].tolist()) for row in range(k)]
    finish = watch.finish[row0 : row0 + k]
    return Group(prompt, ids_KT, (logp_KT * mask).float().cpu(), mask.float().cpu(), texts, finish)


def _ends_here(ids: list[int], watch: _StopWatch) -> bool:
    return ids[-1] in watch.eos_ids or bool(watch.stops and any(s in watch.decode(ids) for s in watch.stops))


def recompute_logprobs(
    model: Any,
    prompt_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor,
    response_ids_RT: torch.Tensor,
    media: Mapping[str, torch.Tensor] | Sequence[Mapping[str, torch.Tensor]],
    temperature: float = 1.0,
    with_logits: bool = False,
    response_mask_RT: torch.Tensor | None = None,
    pad_id: int = 0,
    row_prompt: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One full forward over ``prompt + response`` rows; log softmax(logits / T) of each response token.

    ``prompt_ids`` is one prompt (a list of ints, used for every row; ``media`` then belongs to that one prompt
    and is repeated per row), a ``[R, S]`` tensor of prompt rows, or ``R`` rows of any lengths (for both,
    ``media`` already holds every row's media in row order, see :func:`batch_media`). With ``row_prompt``
    (``R`` indices, row -> prompt), ``prompt_ids`` holds ``U`` distinct prompts and ``media`` is the list of
    their ``U`` media dicts: for a model with ``embed_multimodal`` (the suite's VLM) each distinct prompt's media
    go through the vision tower once and its embedded prompt is shared by its rows (index-select: the gradient
    sums over them), then the response tokens' embeddings are appended and the model runs on ``inputs_embeds``;
    other models, or no media, run the rows as before. Rows of different lengths are left-padded with ``pad_id``
    under an attention mask, so every response starts at the same column and only the response positions go
    through the LM head (``logits_to_keep``). ``response_mask_RT`` (1 = response token, 0 = right padding) also
    hides the responses' padding from the model (MoE load counts; the outputs of real tokens do not depend on
    later positions either way). Returns log-probs ``[R, T]`` (differentiable if grad is on) and, if
    ``with_logits``, the tempered response logits ``[R, T, V]`` (for the entropy metric)."""
    device = next(model.parameters()).device
    r, t = response_ids_RT.shape
    resp = response_ids_RT.to(device)
    if row_prompt is not None:
        if len(row_prompt) != r:
            raise ValueError(f"recompute_logprobs: row_prompt has {len(row_prompt)} entries for {r} response rows")
        if _shares_media(model, media):  # type: ignore[arg-type]
            inputs, prompt_mask = _shared_prompt_inputs(model, prompt_ids, media, row_prompt, resp, pad_id)  # type: ignore[arg-type]
            return _response_logprobs(model, inputs, prompt_mask, resp, response_mask_RT, temperature, with_logits)
        prompt_ids = [list(prompt_ids[i]) for i in row_prompt]  # type: ignore[index]
        media = batch_media([media[i] for i in row_prompt], 1)  # type: ignore[index]
    rows, rep = _prompt_rows(prompt_ids, media, r)  # type: ignore[arg-type]
    if len(rows) != r:
        raise ValueError(f"recompute_logprobs: {len(rows)} prompt rows for {r} response rows")
    prompt_RS, prompt_mask = left_pad(rows, pad_id, device)
    inputs = {"input_ids": torch.cat([prompt_RS, resp], dim=1), **{k: v.to(device) for k, v in rep.items()}}
    return _response_logprobs(model, inputs, prompt_mask, resp, response_mask_RT, temperature, with_logits)


def _shares_media(model: Any, media_U: Sequence[Mapping[str, torch.Tensor]]) -> bool:
    """The shared-prompt path applies: the model splices media into embeddings itself and some prompt has media."""
    return callable(getattr(model, "embed_multimodal", None)) and any(len(m) for m in media_U)


def _shared_prompt_inputs(
    model: Any,
    prompt_ids: Sequence[Sequence[int]] | torch.Tensor,
    media_U: Sequence[Mapping[str, torch.Tensor]],
    row_prompt: Sequence[int],
    resp_RT: torch.Tensor,
    pad_id: int,
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """``inputs_embeds [R, S + T, D]`` from the ``U`` distinct prompts embedded once (media included) and
    expanded to their rows, plus the rows' prompt attention mask ``[R, S]`` (None without padding).

    Response tokens are embedded as ordinary tokens (a media placeholder the policy sampled is one, as in the
    cached decode that sampled it)."""
    device = resp_RT.device
    rows = prompt_ids.tolist() if isinstance(prompt_ids, torch.Tensor) else [list(p) for p in prompt_ids]
    prompt_US, mask_US = left_pad(rows, pad_id, device)
    media = {key: v.to(device) for key, v in batch_media(media_U, 1).items()}
    index = torch.as_tensor(list(row_prompt), dtype=torch.long, device=device)
    prompt_RSD = model.embed_multimodal(prompt_US, **media).index_select(0, index)
    resp_RTD = model.get_input_embeddings()(resp_RT).to(prompt_RSD.dtype)
    mask_RS = None if mask_US is None else mask_US.index_select(0, index)
    return {"inputs_embeds": torch.cat([prompt_RSD, resp_RTD], dim=1)}, mask_RS


def _response_logprobs(
    model: Any,
    inputs: dict[str, torch.Tensor],
    prompt_mask_RS: torch.Tensor | None,
    resp_RT: torch.Tensor,
    response_mask_RT: torch.Tensor | None,
    temperature: float,
    with_logits: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward over ``prompt + response`` (``inputs``: ``input_ids`` + media or ``inputs_embeds``) and the
    response tokens' tempered log-probs (see :func:`recompute_logprobs`)."""
    r, t = resp_RT.shape
    kwargs = dict(inputs)
    if prompt_mask_RS is not None or (response_mask_RT is not None and not bool(response_mask_RT.all())):
        s = next(iter(inputs.values())).shape[1] - t if prompt_mask_RS is None else prompt_mask_RS.shape[1]
        left = prompt_mask_RS if prompt_mask_RS is not None else resp_RT.new_ones(r, s)
        right = torch.ones_like(resp_RT) if response_mask_RT is None else response_mask_RT.to(resp_RT.device).long()
        kwargs["attention_mask"] = torch.cat([left, right], dim=1)
    logits = model(**kwargs, use_cache=False, logits_to_keep=t + 1).logits  # [R, T + 1, V]
    resp_logits = logits[:, :t].float() / temperature  # the last prompt position predicts response token 0
    logp = torch.log_softmax(resp_logits, dim=-1).gather(2, resp_RT[..., None]).squeeze(-1)
    return logp, (resp_logits if with_logits else None)


def _prompt_rows(
    prompt_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor, media: Mapping[str, torch.Tensor], r: int
) -> tuple[list[list[int]], Mapping[str, torch.Tensor]]:
    """Prompt rows and their media in row order (see :func:`recompute_logprobs` for the three forms)."""
    if isinstance(prompt_ids, torch.Tensor):
        return prompt_ids.tolist(), media
    if len(prompt_ids) and not isinstance(prompt_ids[0], int):
        return [[int(i) for i in row] for row in prompt_ids], media  # type: ignore[union-attr]
    return [list(prompt_ids)] * r, repeat_media(media, r)  # type: ignore[arg-type]


__all__ = [
    "Group",
    "Prompt",
    "batch_media",
    "prompt_batches",
    "SamplingConfig",
    "recompute_logprobs",
    "repeat_media",
    "sample_group",
    "sample_groups",
    "sample_tokens",
    "top_p_filter",
]
