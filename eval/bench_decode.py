"""Decode speed of the two applications that generate: the web demo and the lm-eval model, by decoding path.

One command, JSON to ``$OUT/bench_decode.json`` (``OUT`` defaults to ``.``) plus a markdown table on stdout:

    python -m eval.bench_decode [--flavor small] [--vision-flavor small] [--decodes generate graph]

On one fresh random-init ``KimiVLForConditionalGeneration`` (seed 0, built by ``kimi_vl.train.build.build_model``
from a ``model``/``vision`` flavor and the tokenizer's special ids, cast to ``--dtype``), each ``--decodes`` path
(``generate``: transformers' ``generate``; ``static`` / ``graph``: ``kimi_vl.generation.GraphDecoder``, a static
cache, on CUDA each token one CUDA-graph replay) is timed as the applications call it:

- ``demo``: ``eval.demo.generator.WebsiteGenerator(decode=...).generate_batch`` on one synthetic 320x240
  screenshot, ``--max-new-tokens`` at most (the model may end its turn earlier). tokens/s = the generation's new
  tokens (stop token included) / its ``seconds`` (the demo's own timer: prefill, vision tower included, and
  decode; not the prompt's preprocessing); ``call_seconds`` is the whole ``generate_batch`` call.
- ``lm_eval``: ``eval.lm_eval_model.KimiVLLM(decode=...).generate_until`` on ``--lm-requests`` text contexts of
  exactly ``--prompt-tokens`` tokens each (one batch group) with a stop string that never appears, so each runs to
  ``max_gen_toks`` unless it writes the end-of-text token. tokens/s = generated tokens / wall seconds of the
  call. Generated tokens are counted from the ids each row decodes to text inside ``KimiVLLM._generate`` (a
  row's tokens up to and including its first end-of-text), read through a wrapper of the instance's
  ``tok_decode``; if that count does not match the requests (the lm-eval model changed), it falls back to
  re-encoding the texts (``token_count`` in the JSON says which).

Every path gets one untimed warm-up call first (``graph`` captures there), then ``--rounds`` timed calls on CUDA
synchronised ends. Greedy texts of each path are compared with ``generate``'s (equal, else the common prefix in
characters): reported, not asserted (in bf16 a static cache may round differently).

The lm-eval part is the graph path's best case: with ``--lm-requests`` a multiple of ``--lm-batch`` every batch has
the same size, so one decoder of ``kimi_vl.generation.DecoderSlot`` (and its graph) serves them all. Real tasks
mix batch sizes (the last chunk of a length group, small groups of equal token length): the slot keeps a decoder
per batch size (the 4 most recently used), so each size captures its graph once, but a task with many sizes pays
more captures than this benchmark shows.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image, ImageDraw

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NEVER = "<never-appears>"
WORDS = ("red", "blue", "green", "square", "circle", "triangle", "page", "button", "header", "footer", "table",
         "image", "link", "menu", "left", "right", "above", "below", "large", "small", "the", "a", "of", "with")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flavor", default="small", help="kimi_vl text flavor (kimi_vl/flavors.py)")
    p.add_argument("--vision-flavor", default="small", help="MoonViT flavor (vision_encoder/config.py)")
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bfloat16 on cuda, else float32")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lm-requests", type=int, default=8)
    p.add_argument("--lm-batch", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=512, help="tokens of every lm-eval context")
    p.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: train a small one)")
    p.add_argument("--max-patches", type=int, default=256)
    p.add_argument("--decodes", nargs="+", choices=("generate", "static", "graph", "auto"), default=None,
                   help="default: generate graph on cuda, generate static on cpu")
    args = p.parse_args(argv)
    for name in ("max_new_tokens", "rounds", "lm_requests", "lm_batch", "prompt_tokens", "max_patches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    on_cuda = torch.device(args.device).type == "cuda"
    if args.dtype is None:
        args.dtype = "bfloat16" if on_cuda else "float32"
    if args.decodes is None:
        args.decodes = ["generate", "graph"] if on_cuda else ["generate", "static"]
    return args


# ---------------------------------------------------------------- inputs: tokenizer, model, image, contexts


def synthetic_sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences of :data:`WORDS` and numbers (the small tokenizer's training text)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        count = rng.randint(6, 16)
        words = [rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randrange(1000)) for _ in range(count)]
        out.append(" ".join(words).capitalize() + rng.choice((".", "?", "!", ":", ",")))
    return out


def make_tokenizer(path: str | None, workdir: str) -> Any:
    """The tokenizer at ``path``, else a byte-level BPE (vocabulary 1024 at most) trained on synthetic sentences
    into ``workdir`` (``data_pipelines.tokenizer.train_tokenizer``: media, chat and tool special tokens)."""
    from data_pipelines.tokenizer import load_tokenizer, train_tokenizer

    if path is not None:
        return load_tokenizer(path)
    return train_tokenizer(synthetic_sentences(400), Path(workdir) / "tokenizer", vocab_size=1024)


def build_bench_model(flavor: str, vision_flavor: str, tokenizer: Any, device: str, dtype: torch.dtype
                      ) -> torch.nn.Module:
    """A fresh ``KimiVLForConditionalGeneration`` exactly as the training app builds one (seed 0)."""
    from kimi_vl.train.build import build_model
    from kimi_vl.train.config import ModelSection, TrainConfig

    cfg = TrainConfig(output_dir="", max_steps=1, seed=0,
                      model=ModelSection(flavor=flavor, vision_flavor=vision_flavor))
    return build_model(cfg, tokenizer).to(device=device, dtype=dtype).eval()


def synthetic_image(width: int = 320, height: int = 240, seed: int = 0) -> Image.Image:
    """A 'screenshot': seeded coloured rectangles on white."""
    rng = random.Random(seed)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, y0 = rng.randrange(width - 20), rng.randrange(height - 20)
        x1, y1 = rng.randrange(x0 + 10, width), rng.randrange(y0 + 10, height)
        draw.rectangle((x0, y0, x1, y1), fill=tuple(rng.randrange(256) for _ in range(3)))
    return image


def exact_length_text(encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], text: str,
                      tokens: int) -> str | None:
    """A prefix of ``text`` that encodes to exactly ``tokens`` ids, or None (a cut token re-merges)."""
    ids = encode(text)
    for k in range(tokens, min(len(ids), tokens + 8) + 1):
        cut = decode(ids[:k])
        if len(encode(cut)) == tokens:
            return cut
    return None


def lm_contexts(lm: Any, n: int, tokens: int, seed: int = 0) -> list[str]:
    """``n`` different synthetic contexts of exactly ``tokens`` tokens under ``lm.tok_encode`` (how
    ``generate_until`` encodes them), so that they form one batch group."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(50 * n):
        sentences = []
        while sum(len(s) for s in sentences) < 8 * tokens + 64:  # a byte-level BPE token is < 8 characters here
            sentences += synthetic_sentences(8, rng.randrange(10**9))
        text = exact_length_text(lm.tok_encode, lambda ids: lm.tok_decode(ids, skip_special_tokens=False),
                                 " ".join(sentences), tokens)
        if text is not None and text not in out:
            out.append(text)
        if len(out) == n:
            return out
    raise RuntimeError(f"could not build {n} contexts of exactly {tokens} tokens")


def lm_requests(contexts: Sequence[str], max_gen_toks: int) -> list[Any]:
    """Greedy ``generate_until`` instances whose stop string never appears."""
    from lm_eval.api.instance import Instance

    gen = {"until": [NEVER], "max_gen_toks": max_gen_toks, "do_sample": False}
    return [Instance("generate_until", {}, (c, dict(gen)), i) for i, c in enumerate(contexts)]


# ---------------------------------------------------------------- timing


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Best and median tokens/s of timed rounds (each with ``tokens_per_s``)."""
    rates = [r["tokens_per_s"] for r in rounds]
    return {"rounds": rounds, "best_tokens_per_s": max(rates), "median_tokens_per_s": statistics.median(rates)}


def bench_demo(model: torch.nn.Module, tokenizer: Any, decode: str, image: Image.Image, args: argparse.Namespace
               ) -> dict[str, Any]:
    """One warm-up and ``args.rounds`` timed ``WebsiteGenerator.generate_batch`` calls on ``image``."""
    from eval.demo.generator import WebsiteGenerator

    gen = WebsiteGenerator(model, tokenizer, args.max_patches, args.device, decode=decode)
    media = [{"image": image}]
    gen.generate_batch(media, max_new_tokens=args.max_new_tokens)
    rounds, last = [], None
    for _ in range(args.rounds):
        _sync(args.device)
        t0 = time.perf_counter()
        (last,) = gen.generate_batch(media, max_new_tokens=args.max_new_tokens)
        _sync(args.device)
        call = time.perf_counter() - t0
        rounds.append({"seconds": last.seconds, "call_seconds": call, "new_tokens": last.new_tokens,
                       "tokens_per_s": last.new_tokens / last.seconds, "stopped": last.stopped})
    assert last is not None
    out = {"decode": gen.decode, "prompt_tokens": last.prompt_tokens, "vision_tokens": last.vision_tokens,
           **summarize(rounds), "texts": [last.text]}
    del gen
    return out


class TokenCounter:
    """Wraps an lm's ``tok_decode`` to record, per generated row that ``_generate`` decodes, its tokens up to and
    including the first end-of-text (the rest is padding). ``generate_until`` first decodes the end-of-text token
    alone (its stop string): that call is dropped."""

    def __init__(self, lm: Any) -> None:
        self.lm, self.inner, self.eot = lm, lm.tok_decode, lm.eot_token_id
        self.rows: list[int] = []
        lm.tok_decode = self

    def __call__(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        if not skip_special_tokens:
            self.rows.append(tokens.index(self.eot) + 1 if self.eot in tokens else len(tokens))
        return self.inner(tokens, skip_special_tokens=skip_special_tokens)

    def generated(self, requests: int) -> int | None:
        """Tokens generated since the last call (None when the calls did not look as expected); resets."""
        rows, self.rows = self.rows[1:], []
        return sum(rows) if len(rows) == requests else None


def bench_lm(model: torch.nn.Module, tokenizer: Any, decode: str, requests: list[Any], args: argparse.Namespace
             ) -> dict[str, Any]:
    """One warm-up and ``args.rounds`` timed ``KimiVLLM.generate_until`` calls on ``requests``."""
    from eval.lm_eval_model import KimiVLLM

    lm = KimiVLLM(pretrained=model, tokenizer=tokenizer, decode=decode, batch_size=args.lm_batch,
                  max_gen_toks=args.max_new_tokens, device=args.device)
    counter = TokenCounter(lm)
    lm.generate_until(requests, disable_tqdm=True)
    counter.generated(len(requests))
    rounds, texts, method = [], [], "decoded ids"
    for _ in range(args.rounds):
        _sync(args.device)
        t0 = time.perf_counter()
        texts = lm.generate_until(requests, disable_tqdm=True)
        _sync(args.device)
        seconds = time.perf_counter() - t0
        tokens = counter.generated(len(requests))
        if tokens is None:
            method = "re-encoded texts"
            tokens = sum(len(lm.tok_encode(t)) for t in texts)
        rounds.append({"seconds": seconds, "new_tokens": tokens, "tokens_per_s": tokens / seconds})
    out = {"decode": lm.decode, "requests": len(requests), "batch_size": args.lm_batch, "token_count": method,
           **summarize(rounds), "texts": texts}
    del lm, counter
    return out


# ---------------------------------------------------------------- agreement, report


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def add_agreement(part: dict[str, dict[str, Any]]) -> None:
    """Per decode of a part: ``texts_equal`` generate's (None without generate) and, per text, the common prefix
    length in characters when they differ."""
    ref = part.get("generate")
    for name, res in part.items():
        if ref is None or name == "generate":
            res["texts_equal"] = None if ref is None else True
            continue
        res["texts_equal"] = res["texts"] == ref["texts"]
        if not res["texts_equal"]:
            res["common_prefix_chars"] = [common_prefix(a, b) for a, b in zip(res["texts"], ref["texts"])]


def table(results: dict[str, Any]) -> str:
    a = results["args"]
    lines = [f"{results['device']}, torch {results['torch']}, flavor {a['flavor']} + vision {a['vision_flavor']}, "
             f"{a['dtype']}, max_new_tokens {a['max_new_tokens']}, {a['rounds']} rounds, {results['date']}", "",
             "| part | decode | tokens/s (best) | median | speedup vs generate | texts equal |",
             "| --- | --- | --- | --- | --- | --- |"]
    for part in ("demo", "lm_eval"):
        ref = results[part].get("generate")
        for name, r in results[part].items():
            speed = f"{r['best_tokens_per_s'] / ref['best_tokens_per_s']:.2f}x" if ref else "-"
            equal = "-" if r["texts_equal"] is None else "yes" if r["texts_equal"] else \
                f"no (prefix {min(r['common_prefix_chars'])} chars)"
            lines.append(f"| {part} | {name} | {r['best_tokens_per_s']:,.1f} | {r['median_tokens_per_s']:,.1f} | "
                         f"{speed} | {equal} |")
    return "\n".join(lines)


def _free(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _progress(part: str, name: str, res: dict[str, Any]) -> None:
    tokens = res["rounds"][-1]["new_tokens"]
    print(f"[{part}] {name} (runs {res['decode']}): best {res['best_tokens_per_s']:,.1f} tokens/s, median "
          f"{res['median_tokens_per_s']:,.1f}, {tokens} new tokens per round", flush=True)


def run(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    """Both parts for every decode of ``args``; the results dict (also written as JSON)."""
    from eval.lm_eval_model import KimiVLLM

    tokenizer = make_tokenizer(args.tokenizer, workdir)
    model = build_bench_model(args.flavor, args.vision_flavor, tokenizer, args.device, DTYPES[args.dtype])
    cuda = torch.device(args.device).type == "cuda"
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(args.device) if cuda else "cpu", "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"), "args": vars(args), "vocab_size": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()), "demo": {}, "lm_eval": {}}
    image = synthetic_image()
    for decode in args.decodes:
        results["demo"][decode] = bench_demo(model, tokenizer, decode, image, args)
        _progress("demo", decode, results["demo"][decode])
        _free(args.device)
    probe = KimiVLLM(pretrained=model, tokenizer=tokenizer, decode="generate", device=args.device)
    requests = lm_requests(lm_contexts(probe, args.lm_requests, args.prompt_tokens), args.max_new_tokens)
    results["lm_eval_prompt_tokens"] = len(probe.tok_encode(requests[0].args[0]))
    del probe
    for decode in args.decodes:
        results["lm_eval"][decode] = bench_lm(model, tokenizer, decode, requests, args)
        _progress("lm_eval", decode, results["lm_eval"][decode])
        _free(args.device)
    add_agreement(results["demo"])
    add_agreement(results["lm_eval"])
    return results


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="bench_decode-") as workdir:
        results = run(args, workdir)
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_decode.json").write_text(json.dumps(results, indent=2))
    print(table(results))
    return results


if __name__ == "__main__":
    main()
