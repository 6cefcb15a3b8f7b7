"""The ``kimi_vl`` model for lm-eval: log-likelihoods, rolling perplexity and generation, with images/video.

Written against the transformers causal-LM interface only (``model(input_ids=, attention_mask=).logits`` and
``model.generate``), so it serves the suite's ``KimiVLForCausalLM``/``KimiVLForConditionalGeneration`` exports
as well as any HF causal LM (the tests use a tiny ``KimiLinearForCausalLM``). Tokenisation of
context/continuation pairs is lm-eval's ``TemplateLM`` logic, i.e. the same as lm-eval's ``hf`` model, so the two
agree on a checkpoint both can load.

Exactness over padding: scoring batches are right-padded (a causal model's logits at real positions do not
depend on later pad tokens) and generation batches hold only contexts of equal token length (no padding at
all), so batching never changes a result; ``KimiLinear``-style recurrent layers need no padding support.

Requests with visuals (``MULTIMODAL = True``: lm-eval passes ``{"visual": [PIL images]}`` as a third argument)
go through :mod:`eval.media_prompt`. Log-likelihoods sum over continuation tokens only, so images are never
scored. Caching: lm-eval's ``--use_cache DIR`` wraps any LM (keyed on request arguments).

model_args (strings from the command line): ``checkpoint`` (or ``pretrained``) = export dir, ``tokenizer``
(default: the checkpoint), ``batch_size``, ``max_length``, ``max_gen_toks``, ``device``, ``dtype``,
``video_fps``, ``add_bos_token``, ``decode`` (``auto`` | ``generate`` | ``static`` | ``graph``: generation through
transformers' ``generate`` or ``kimi_vl.generation.GraphDecoder``, a static cache replayed as a CUDA graph per
token, for greedy requests; ``auto`` picks ``graph`` on CUDA for a kimi_vl model without MoE; the same texts).

Generations come back with the special tokens removed, unless the task's ``generation_kwargs`` hold
``keep_special_tokens: true`` (a key of this model only; lm-eval's ``hf`` model would pass it on to
``generate``): then they keep them, e.g. the tool-call markers that ``kimi_vision_tooluse`` checks.

Shapes: B batch rows, T tokens, V vocab.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections import defaultdict
from typing import Any

# Fill lm-eval's lazy model registry before registering ours: get_model() loads the built-in models ("hf", ...)
# only while the registry is empty, so registering into an empty one would hide them.
import lm_eval.models  # noqa: F401
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from eval.media_prompt import MediaPrompt, build_media_prompt, merge_media
from kimi_vl.exports import export_folder
from kimi_vl.modeling.multimodal import MEDIA_KEYS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def _as_bool(v: Any) -> bool:
    return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")


def load_checkpoint(path: str, dtype: str = "float32", device: str = "cpu") -> torch.nn.Module:
    """``import kimi_vl`` (registers the suite's Auto classes), then ``from_pretrained`` of ``path`` (``RUN`` or
    ``RUN/final``) with ``AutoModelForImageTextToText`` when the checkpoint has a vision tower, else
    ``AutoModelForCausalLM``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    import kimi_vl  # noqa: F401 - registers KimiVL configs/models with transformers' Auto classes

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    path = str(export_folder(path, "checkpoint"))
    config = AutoConfig.from_pretrained(path)
    auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) else AutoModelForCausalLM
    model = auto.from_pretrained(path, dtype=DTYPES[dtype])
    return model.to(device).eval()


class StopStrings:
    """``generate`` stopping criterion: per row, whether its new text contains a stop string (checked on decoded
    text, so a stop string split across tokens is still found), for calls on one batch's growing ids.

    Each call decodes only the tokens added since the previous call plus ``back`` tokens before them (a stop string
    of ``c`` characters spans at most ``4 c`` tokens when every token decodes to at least one byte, as in byte-level
    BPE), and a row once found stays done. Decoding every row's whole new text at every step cost time quadratic in
    the generation's length: ``python scripts/time_stop_strings.py`` (2-core CPU, batch 8) 56.7 -> 33.1 ms over
    256 steps, 853.8 -> 141.3 ms over 1024 (a 256-token graph-replayed batch of 8 took ~0.5 s on an H100).
    ``back``: default ``4 * longest stop + 8``."""

    def __init__(self, tokenizer: Any, stops: list[str], prompt_len: int, back: int | None = None) -> None:
        self.tokenizer, self.stops, self.prompt_len = tokenizer, [s for s in stops if s], prompt_len
        self.back = 4 * max((len(s) for s in self.stops), default=0) + 8 if back is None else back
        self.seen = 0  # new tokens at the previous call
        self.done: list[bool] | None = None

    def __call__(self, input_ids_BT: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
        new_len = input_ids_BT.shape[1] - self.prompt_len
        if self.done is None or len(self.done) != input_ids_BT.shape[0] or new_len < self.seen:
            self.done, self.seen = [False] * input_ids_BT.shape[0], 0  # another batch: start over
        start = self.prompt_len + max(0, self.seen - self.back)
        self.seen = new_len
        if self.stops:
            tails = self.tokenizer.batch_decode(input_ids_BT[:, start:], skip_special_tokens=False)
            self.done = [d or any(s in text for s in self.stops) for d, text in zip(self.done, tails)]
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids_BT.device)


@register_model("kimi_vl")
class KimiVLLM(TemplateLM):
    """lm-eval ``LM`` over a transformers-style causal LM and tokenizer (see the module docstring)."""

    MULTIMODAL = True

    def __init__(self, checkpoint: str | None = None, pretrained: Any = None, tokenizer: Any = None,
                 batch_size: int | str = 8, max_length: int | str | None = None, max_gen_toks: int | str = 256,
                 device: str | None = None, dtype: str = "float32", video_fps: float | str = 1.0,
                 add_bos_token: bool | str = False, processor: Any = None, decode: str = "auto",
                 **_ignored: Any) -> None:
        super().__init__()
        from transformers import AutoTokenizer

        source = checkpoint if checkpoint is not None else pretrained
        if source is None:
            raise ValueError("kimi_vl: pass model_args checkpoint=DIR (or a model instance as pretrained=)")
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self._device.type == "cuda" and not torch.cuda.is_available():  # lm-eval's own CLI defaults to cuda
            warnings.warn(f"kimi_vl: device {device!r} asked for but CUDA is not available; running on the CPU",
                          stacklevel=2)
            self._device = torch.device("cpu")
        if isinstance(source, torch.nn.Module):
            self.model = source.to(self._device).eval()
        else:
            source = str(export_folder(str(source), "checkpoint"))  # RUN or RUN/final; the tokenizer lies beside
            self.model = load_checkpoint(source, dtype, str(self._device))
        if tokenizer is None or isinstance(tokenizer, str):
            tok_source = tokenizer or (source if isinstance(source, str) else None)
            if tok_source is None:
                raise ValueError("kimi_vl: a model instance needs tokenizer= (an object or a path)")
            tokenizer = AutoTokenizer.from_pretrained(tok_source)
        self.tokenizer = tokenizer
        self.batch_size = int(str(batch_size).split(":")[0]) if str(batch_size) != "auto" else 8
        self._max_length = int(max_length) if max_length is not None else None
        self.max_gen_toks = int(max_gen_toks)
        self.video_fps = float(video_fps)
        self.add_bos_token = _as_bool(add_bos_token)
        self._processor = processor
        self._forward_params = set(inspect.signature(self.model.forward).parameters)
        from kimi_vl.generation import DecoderSlot, resolve_decode

        self.decode = resolve_decode(decode, self.model, self._device)  # sampling requests keep generate
        self._decoders: Any = None  # kimi_vl.generation.DecoderSlot when decode is static or graph
        if self.decode != "generate":
            self._decoders = DecoderSlot(self.model, use_graph=self.decode == "graph")

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        if self._max_length is not None:
            return self._max_length
        for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(self.model.config, attr, None)
            if isinstance(value, int) and value < 10**7:
                return value
        return 2048

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def processor(self):
        if self._processor is None:
            from vision_encoder.processor import MoonViTProcessor

            self._processor = MoonViTProcessor()
        return self._processor

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        special = self.add_bos_token if add_special_tokens is None else add_special_tokens
        return self.tokenizer.encode(string, add_special_tokens=special)

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def _forward_logits(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor,
                        media: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        kwargs: dict[str, Any] = {"input_ids": input_ids_BT, "attention_mask": attention_mask_BT}
        if "use_cache" in self._forward_params:
            kwargs["use_cache"] = False
        if media:
            missing = [k for k in media if k not in self._forward_params]
            if missing:
                raise ValueError(f"{type(self.model).__name__}.forward takes no {missing}: not a multimodal model")
            kwargs.update({k: v.to(self._device) for k, v in media.items()})
        with torch.no_grad():
            return self.model(**kwargs).logits.float()  # [B, T, V]

    def _score_batch(self, rows: list[tuple[list[int], int]], media: dict[str, torch.Tensor] | None = None
                     ) -> list[tuple[float, bool]]:
        """``rows`` = (input tokens, number of trailing continuation tokens); right-padded forward."""
        width = max(len(toks) for toks, _ in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eot_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (toks, _) in enumerate(rows):
            ids[i, : len(toks)] = torch.tensor(toks)
            mask[i, : len(toks)] = 1
        logprobs_BTV = F.log_softmax(self._forward_logits(ids.to(self._device), mask.to(self._device), media), -1)
        out = []
        for i, (toks, n_cont) in enumerate(rows):
            n = len(toks)
            # logits at position t predict token t + 1; continuation tokens sit at n - n_cont .. n - 1
            lp_CV = logprobs_BTV[i, n - n_cont - 1 : n - 1]
            target_C = ids[i, n - n_cont : n].to(lp_CV.device)
            ll = lp_CV.gather(-1, target_C[:, None]).sum().item()
            greedy = bool((lp_CV.argmax(-1) == target_C).all().item())
            out.append((float(ll), greedy))
        return out

    def _window(self, context_enc: list[int], continuation_enc: list[int]) -> tuple[list[int], int]:
        """Last ``max_length + 1`` tokens of context + continuation, minus the final one (it is only a target)."""
        if not continuation_enc:
            raise ValueError("kimi_vl: empty continuation (nothing to score)")
        if len(continuation_enc) > self.max_length:
            raise ValueError(f"continuation of {len(continuation_enc)} tokens exceeds max_length {self.max_length}")
        whole = (context_enc + continuation_enc)[-(self.max_length + 1):]
        return whole, len(continuation_enc)

    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **kwargs: Any
                              ) -> list[tuple[float, bool]]:
        """Batched scoring of (key, context ids, continuation ids) requests; longest first, results in order."""
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="kimi_vl loglikelihood")
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            rows = []
            for i in idx:
                whole, n_cont = self._window(requests[i][1], requests[i][2])
                rows.append((whole, n_cont))
            for i, res in zip(idx, self._score_batch(rows)):
                results[i] = res
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], res)
            bar.update(len(idx))
        bar.close()
        return results  # type: ignore[return-value]

    def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        if not requests or len(requests[0].args) < 3:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        results = []
        for req in tqdm(requests, disable=disable_tqdm, desc="kimi_vl loglikelihood (visual)"):
            context, continuation, aux = req.args
            mp = build_media_prompt(context, list(aux.get("visual") or []), self.processor, self.video_fps)
            ctx_enc, cont_enc = self._encode_pair(mp.text, continuation)
            self._check_media_tokens(ctx_enc, mp)
            if len(ctx_enc) + len(cont_enc) > self.max_length + 1:
                raise ValueError(f"visual request of {len(ctx_enc) + len(cont_enc)} tokens exceeds max_length "
                                 f"{self.max_length}; media cannot be truncated")
            results.append(self._score_batch([(ctx_enc + cont_enc, len(cont_enc))], merge_media([mp]))[0])
        return results

    def _check_media_tokens(self, ids: list[int], mp: MediaPrompt) -> None:
        for token, expected in (("<|media_pad|>", mp.n_image_tokens), ("<|kimi_k25_video_placeholder|>",
                                                                          mp.n_video_tokens)):
            if expected:
                tid = self.tokenizer.convert_tokens_to_ids(token)
                if ids.count(tid) != expected:
                    raise ValueError(f"tokenizer turned {expected} {token} into {ids.count(tid)} ids: "
                                     f"it must have {token} as a special token")

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """Sum of log-probs of each whole string in disjoint windows of ``max_length`` tokens."""
        if requests and len(requests[0].args) >= 3 and requests[0].args[2].get("visual"):
            raise ValueError("kimi_vl: loglikelihood_rolling scores text only; the request carries visuals")
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="kimi_vl loglikelihood_rolling"):
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(req.args[0]), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            scores = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows], disable_tqdm=True)
            total = sum(s for s, _ in scores)
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
            out.append(total)
        return out

    def _generate(self, contexts_ids: list[list[int]], until: list[str], max_gen: int, kwargs: dict,
                  media: dict[str, torch.Tensor] | None, keep_special: bool = False) -> list[str]:
        ids = torch.tensor(contexts_ids, dtype=torch.long, device=self._device)  # [B, T] equal lengths
        gen_kwargs = {"do_sample": False, **kwargs}
        if not gen_kwargs.get("do_sample"):
            gen_kwargs.pop("temperature", None)
            gen_kwargs.pop("top_p", None)
        if media:
            gen_kwargs.update({k: v.to(self._device) for k, v in media.items()})
        from transformers import StoppingCriteriaList

        stop = StopStrings(self.tokenizer, until, ids.shape[1])
        options = {k: v for k, v in gen_kwargs.items() if k not in MEDIA_KEYS}
        if self.decode != "generate" and options == {"do_sample": False}:  # greedy; sampling keeps generate's
            # defaults (transformers' top_k = 50 ...)
            out = self._decoders.get(ids.shape[0], ids.shape[1] + max_gen).generate(
                ids, max_new_tokens=max_gen, stop=stop, pad_token_id=self.eot_token_id,
                eos_token_id=self.eot_token_id, **gen_kwargs)
        else:
            with torch.no_grad():
                out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_gen,
                                          stopping_criteria=StoppingCriteriaList([stop]),
                                          pad_token_id=self.eot_token_id, eos_token_id=self.eot_token_id,
                                          **gen_kwargs)
        texts = []
        for row in out[:, ids.shape[1]:].tolist():
            text = self.tok_decode(row, skip_special_tokens=False)
            for stop in until:
                if stop and stop in text:
                    text = text.split(stop)[0]
            for special in ([] if keep_special else self.tokenizer.all_special_tokens):
                text = text.replace(special, "")
            texts.append(text)
        return texts

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Greedy (unless ``do_sample``) generation cut at the first stop string; batches of equal-length
        contexts with identical generation kwargs, so no padding is ever needed."""
        groups: dict[tuple, list[int]] = defaultdict(list)
        encoded, media_prompts = [], []
        for i, req in enumerate(requests):
            context, gen = req.args[0], req.args[1]
            visuals = list(req.args[2].get("visual") or []) if len(req.args) > 2 else []
            mp = build_media_prompt(context, visuals, self.processor, self.video_fps) if visuals else None
            media_prompts.append(mp)
            encoded.append(self.tok_encode(mp.text if mp else context))
            groups[(len(encoded[-1]), repr(sorted(gen.items())))].append(i)
        results: list[str | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="kimi_vl generate_until")
        eos_text = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        for (_, _), idx in sorted(groups.items(), key=lambda kv: -kv[0][0]):
            gen = copy.deepcopy(requests[idx[0]].args[1])
            until = gen.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            if eos_text not in until:
                until.append(eos_text)
            max_gen = int(gen.pop("max_gen_toks", self.max_gen_toks))
            keep_special = _as_bool(gen.pop("keep_special_tokens", False))
            has_media = any(media_prompts[i] is not None for i in idx)
            step = 1 if has_media else self.batch_size
            for start in range(0, len(idx), step):
                chunk = idx[start : start + step]
                budget = self.max_length - max_gen
                if has_media and len(encoded[chunk[0]]) > budget:
                    raise ValueError(f"visual prompt of {len(encoded[chunk[0]])} tokens exceeds max_length - "
                                     f"max_gen_toks = {budget}; media cannot be truncated")
                ctx = [encoded[i][-budget:] for i in chunk]
                chunk_media = [media_prompts[i] for i in chunk if media_prompts[i] is not None]
                media = merge_media(chunk_media) if chunk_media else None
                for i, text in zip(chunk, self._generate(ctx, until, max_gen, gen, media, keep_special)):
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(chunk))
        bar.close()
        return results  # type: ignore[return-value]


__all__ = ["KimiVLLM", "load_checkpoint"]
