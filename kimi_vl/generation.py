"""Fast single-token decode: a static cache and, on CUDA, the whole decode step replayed as one CUDA graph.

Batch-1 decode of a small model is bound by the host: a ``small`` hybrid step launches about a thousand kernels
(``kimi_vl/benchmarks/decode_ops.py``), each costing the host more than the GPU. :class:`GraphDecoder` prefills
with the model's ordinary forward (a dynamic :class:`~kimi_vl.modeling.cache.KimiVLCache`), copies that state into
a :class:`~kimi_vl.modeling.cache.StaticKimiVLCache` (fixed shapes and addresses: KDA states updated in place, MLA
entries written at a device index and attended under a mask over the whole buffer) and runs each further token
through that cache: eagerly, or on CUDA as a captured graph (one launch per token).

    dec = GraphDecoder(model, batch_size=1, capacity=4096)
    ids = dec.generate(prompt_ids, max_new_tokens=64)          # greedy; do_sample=True for sampling

Greedy tokens equal ``model.generate(do_sample=False)``'s (``tests/model/test_static_decode.py``). The graph is
captured once per decoder (at its first prefill) and reused by every later prefill of the same batch size. It
reads the model's parameters in place: updating them in place (an optimizer step, ``load_state_dict``) is seen by
the next replay; replacing a parameter tensor is not (build a new decoder). MoE layers read expert counts on the
host, so a model with MoE decodes through the static cache without a graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from kimi_vl.modeling.cache import StaticKimiVLCache, output_cache

__all__ = ["DECODES", "DecoderSlot", "GraphDecoder", "has_moe", "resolve_decode"]

_WHERE = "kimi_vl.generation.GraphDecoder"


def has_moe(model: nn.Module) -> bool:
    """Whether ``model`` has MoE layers (their expert dispatch reads counts on the host: no graph capture)."""
    from kimi_vl.modeling.moe import MoE

    return any(isinstance(m, MoE) for m in model.modules())


class GraphDecoder:
    """Decode steps of a ``KimiVLForCausalLM`` (or the multimodal ``KimiVLForConditionalGeneration``, media given to
    :meth:`prefill`) over a static cache of ``capacity`` tokens (prompt included).

    ``use_graph``: capture the step as a CUDA graph (default: on CUDA for models without MoE layers). The logits a
    graphed :meth:`step` returns live in a buffer that the next step overwrites (clone to keep them).
    """

    def __init__(self, model: nn.Module, batch_size: int, capacity: int, use_graph: bool | None = None) -> None:
        if batch_size < 1 or capacity < 2:
            raise ValueError(f"{_WHERE}: batch_size must be >= 1 and capacity >= 2, got {batch_size}, {capacity}")
        device = next(model.parameters()).device
        moe = has_moe(model)
        if use_graph is None:
            use_graph = device.type == "cuda" and not moe
        if use_graph and moe:
            raise ValueError(f"{_WHERE}: a model with MoE layers cannot be captured (the expert dispatch reads "
                             "per-expert counts on the host); pass use_graph=False")
        if use_graph and device.type != "cuda":
            raise ValueError(f"{_WHERE}: use_graph needs the model on CUDA, it is on {device}")
        self.model, self.batch_size, self.capacity, self.use_graph = model, batch_size, capacity, use_graph
        self.device = device
        self.cache: StaticKimiVLCache | None = None
        self._tokens_B1 = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
        self._logits_BV: torch.Tensor | None = None
        self._graph: torch.cuda.CUDAGraph | None = None

    @torch.no_grad()
    def prefill(self, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor | None = None,
                chunk: int | None = None, **media: torch.Tensor | None) -> torch.Tensor:
        """Run the prompt (left padding marked by ``attention_mask``) and load its state; returns the last
        position's logits ``[B, V]``. ``chunk``: run the prompt in pieces of this many tokens (bounds the
        activation memory of long prompts). ``media``: the multimodal model's ``pixel_values``, ``image_grid_thw``,
        ... for the prompt's placeholders (the prompt then runs in one piece)."""
        if input_ids_BL.dim() != 2 or input_ids_BL.shape[0] != self.batch_size or input_ids_BL.shape[1] < 1:
            raise ValueError(f"{_WHERE}.prefill: input_ids must be [B={self.batch_size}, L >= 1], got "
                             f"{tuple(input_ids_BL.shape)}")
        if input_ids_BL.shape[1] >= self.capacity:
            raise ValueError(f"{_WHERE}.prefill: the prompt has {input_ids_BL.shape[1]} tokens, the capacity is "
                             f"{self.capacity}: no room to decode")
        length = input_ids_BL.shape[1]
        step = length if chunk is None else chunk
        if step < 1:
            raise ValueError(f"{_WHERE}.prefill: chunk must be >= 1, got {chunk}")
        media = {k: v for k, v in media.items() if v is not None}
        if media and step < length:
            raise ValueError(f"{_WHERE}.prefill: a prompt with media ({sorted(media)}) runs in one piece, got "
                             f"chunk={chunk} for {length} tokens")
        prefill = None
        for start in range(0, length, step):
            end = min(start + step, length)
            out = self.model(input_ids=input_ids_BL[:, start:end], use_cache=True, logits_to_keep=1, cache=prefill,
                             attention_mask=None if attention_mask_BL is None else attention_mask_BL[:, :end],
                             **media)
            prefill = output_cache(out)
        if self.cache is None:  # zeroed buffers shaped like the prefill's; the capture's warm-up steps write them
            self.cache = StaticKimiVLCache(self.model.config, self.batch_size, self.capacity, self.device, prefill)
            if self.use_graph:
                self._capture()
        self.cache.load(prefill, attention_mask_BL)
        return out.logits[:, -1]

    def _forward_step(self) -> torch.Tensor:
        out = self.model(input_ids=self._tokens_B1, cache=self.cache, use_cache=True)
        return out.logits[:, -1]

    def _capture(self) -> None:
        """Warm up (Triton compiles, the AttnRes launchers bind their kernels) on a side stream, then capture one
        step. Both write the cache; the caller loads the prefill state afterwards."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward_step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._logits_BV = self._forward_step()

    @torch.no_grad()
    def step(self, tokens_B: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; returns the next-token logits ``[B, V]``."""
        if self.cache is None:
            raise RuntimeError(f"{_WHERE}.step: call prefill first")
        if tokens_B.shape != (self.batch_size,):
            raise ValueError(f"{_WHERE}.step: tokens must be [B={self.batch_size}], got {tuple(tokens_B.shape)}")
        if self.cache.length >= self.capacity:
            raise ValueError(f"{_WHERE}.step: the cache is full ({self.capacity} tokens)")
        self._tokens_B1.copy_(tokens_B[:, None])
        if self._graph is None:
            return self._forward_step()
        self._graph.replay()
        self.cache.note_replayed(1)
        return self._logits_BV

    @torch.no_grad()
    def generate(self, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor | None = None,
                 max_new_tokens: int = 32, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, eos_token_id: int | Sequence[int] | None = None,
                 pad_token_id: int | None = None, generator: torch.Generator | None = None,
                 max_time: float | None = None, stop: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 **media: torch.Tensor | None) -> torch.Tensor:
        """The prompt followed by up to ``max_new_tokens`` tokens ``[B, L + n]``: greedy, or sampled at
        ``temperature`` (over the ``top_k`` most likely tokens when given). Rows that produced an ``eos_token_id``
        (one id or several), or that ``stop`` (called with the ids so far ``[B, L + n]``, returning bool ``[B]``,
        like a transformers ``StoppingCriteria``) reports done, continue with ``pad_token_id`` (the first eos id
        when unset); generation stops when every row is done, or after ``max_time`` seconds. ``media``: see
        :meth:`prefill`."""
        if max_new_tokens < 1:
            raise ValueError(f"{_WHERE}.generate: max_new_tokens must be >= 1, got {max_new_tokens}")
        if input_ids_BL.shape[1] + max_new_tokens > self.capacity:
            raise ValueError(f"{_WHERE}.generate: {input_ids_BL.shape[1]} prompt + {max_new_tokens} new tokens "
                             f"exceed the capacity {self.capacity}")
        if do_sample and not temperature > 0:
            raise ValueError(f"{_WHERE}.generate: temperature must be > 0 when sampling, got {temperature}")
        start = time.perf_counter()
        eos_ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) \
            else list(eos_token_id)
        eos = torch.tensor(eos_ids, device=self.device) if eos_ids else None
        pad = (None if eos is None else int(eos[0])) if pad_token_id is None else pad_token_id
        if stop is not None and pad is None:
            raise ValueError(f"{_WHERE}.generate: a stop criterion needs pad_token_id (or eos_token_id) for the rows "
                             "it ends")
        checks = eos is not None or stop is not None
        logits = self.prefill(input_ids_BL, attention_mask_BL, **media)
        done = torch.zeros(self.batch_size, dtype=torch.bool, device=self.device)
        width = input_ids_BL.shape[1]
        out = input_ids_BL.new_empty(self.batch_size, width + max_new_tokens, device=self.device)  # written in
        out[:, :width] = input_ids_BL  # place, so that a step stacks and concatenates nothing
        for n in range(max_new_tokens):
            token = _pick(logits, do_sample, temperature, top_k, generator)
            if checks:
                token = torch.where(done, torch.full_like(token, pad), token)
            if eos is not None:
                done |= torch.isin(token, eos)
            out[:, width + n] = token
            if stop is not None:
                done |= stop(out[:, :width + n + 1]).to(done.device)
            if n + 1 == max_new_tokens or (checks and bool(done.all())):
                break
            if max_time is not None and time.perf_counter() - start > max_time:
                break
            logits = self.step(token)
        return out[:, :width + n + 1]


DECODES = ("auto", "generate", "static", "graph")


def resolve_decode(decode: str, model: nn.Module, device: torch.device) -> str:
    """A caller's ``decode`` option: ``generate`` (transformers' ``generate``), ``static`` (:class:`GraphDecoder`
    without the graph), ``graph``, or ``auto``: ``graph`` on CUDA for a kimi_vl model without MoE layers, else
    ``generate``. ``static`` and ``graph`` need a kimi_vl model."""
    if decode not in DECODES:
        raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
    from kimi_vl.modeling.model import KimiVLModel

    ours = any(isinstance(m, KimiVLModel) for m in model.modules())
    if decode in ("static", "graph") and not ours:
        raise ValueError(f"decode={decode} needs a kimi_vl model (its static cache), got {type(model).__name__}; "
                         "use decode=generate")
    if decode != "auto":
        return decode
    return "graph" if device.type == "cuda" and ours and not has_moe(model) else "generate"


class DecoderSlot:
    """The :class:`GraphDecoder` s of a model for callers whose batch size and length vary (the demo, lm-eval): one
    per batch size, the ``keep`` most recently used (a length group of lm-eval alternates between its full batches
    and a smaller last one: a single decoder would be rebuilt, and its graph re-captured, at every change).
    :meth:`get` reuses the batch size's decoder when its capacity suffices (its captured graph too), else frees it
    and builds one whose capacity is rounded up to a multiple of ``round_to``."""

    def __init__(self, model: nn.Module, use_graph: bool, round_to: int = 512, keep: int = 4) -> None:
        if keep < 1:
            raise ValueError(f"DecoderSlot: keep must be >= 1, got {keep}")
        self.model, self.use_graph, self.round_to, self.keep = model, use_graph, round_to, keep
        self.decoders: dict[int, GraphDecoder] = {}  # batch size -> decoder, least recently used first

    @property
    def current(self) -> GraphDecoder | None:
        """The most recently used decoder."""
        return next(reversed(self.decoders.values()), None)

    def get(self, batch_size: int, tokens: int) -> GraphDecoder:
        """A decoder for ``batch_size`` rows of up to ``tokens`` tokens (prompt + new)."""
        dec = self.decoders.pop(batch_size, None)
        if dec is None or dec.capacity < tokens:
            dec = None  # the old cache and graph go before the new ones are allocated
            while len(self.decoders) >= self.keep:
                del self.decoders[next(iter(self.decoders))]
            capacity = -(-tokens // self.round_to) * self.round_to
            dec = GraphDecoder(self.model, batch_size, capacity, use_graph=self.use_graph)
        self.decoders[batch_size] = dec
        return dec


def _pick(logits_BV: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None,
          generator: torch.Generator | None) -> torch.Tensor:
    if not do_sample:
        return logits_BV.argmax(-1)
    scores = logits_BV.float() / temperature
    if top_k is not None:
        kth = scores.topk(min(top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    return torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0]
