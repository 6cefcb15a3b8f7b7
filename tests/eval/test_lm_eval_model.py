"""The ``kimi_vl`` lm-eval model: exact log-likelihoods, stop strings, rolling perplexity, parity with ``hf``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance

from eval.lm_eval_model import KimiVLLM


@pytest.fixture(scope="module")
def lm(ckpt) -> KimiVLLM:
    return KimiVLLM(checkpoint=str(ckpt), batch_size=3, device="cpu")


def req(kind: str, *args) -> Instance:
    return Instance(kind, {}, tuple(args), 0)


def manual_logprob(lm: KimiVLLM, ctx_ids: list[int], cont_ids: list[int]) -> float:
    ids = torch.tensor([ctx_ids + cont_ids])
    with torch.no_grad():
        logp = torch.log_softmax(lm.model(input_ids=ids).logits.double(), -1)[0]
    return sum(logp[len(ctx_ids) + i - 1, t].item() for i, t in enumerate(cont_ids))


def test_loglikelihood_equals_manual_sum_in_batches_of_mixed_lengths(lm):
    pairs = [("The red square is", " left of the blue circle"), ("Count", " the objects"),
             ("Question: what colour is the triangle? Answer:", " green"), ("Two", " cats"), ("", "The chart")]
    got = lm.loglikelihood([req("loglikelihood", c, x) for c, x in pairs])
    for (ctx, cont), (ll, _) in zip(pairs, got):
        if ctx:
            ctx_ids, cont_ids = lm._encode_pair(ctx, cont)
        else:
            ctx_ids, cont_ids = [lm.prefix_token_id], lm.tok_encode(cont)
        assert ll == pytest.approx(manual_logprob(lm, ctx_ids, cont_ids), abs=1e-4), (ctx, cont)


def test_checkpoint_may_name_the_run_folder(lm, ckpt, tmp_path):
    import shutil

    shutil.copytree(ckpt, tmp_path / "run" / "final")
    run = KimiVLLM(checkpoint=str(tmp_path / "run"), batch_size=3, device="cpu")
    request = [req("loglikelihood", "Two", " cats")]
    assert run.loglikelihood(request) == lm.loglikelihood(request)


def test_is_greedy_flag(lm):
    ctx_ids = lm.tok_encode("The red square is")
    ids = torch.tensor([ctx_ids])
    greedy = []
    with torch.no_grad():
        for _ in range(3):
            nxt = lm.model(input_ids=ids).logits[0, -1].argmax().item()
            greedy.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    res = lm._loglikelihood_tokens([(None, ctx_ids, greedy), (None, ctx_ids, greedy[:2] + [(greedy[2] + 1) % 300])])
    assert res[0][1] is True and res[1][1] is False


def test_generate_until_respects_stop_strings_and_batching(lm):
    prompt = "Count the objects:"
    free = lm.generate_until([req("generate_until", prompt, {"until": [], "max_gen_toks": 12})])[0]
    assert len(free) >= 4, free
    stop = free[2:4]
    cut = lm.generate_until([req("generate_until", prompt, {"until": [stop], "max_gen_toks": 12})])[0]
    assert cut == free.split(stop)[0] and stop not in cut
    # a batch of equal-length prompts gives the same texts as one at a time
    prompts = ["Count the objects:", "Count the object:", "The red square is"]
    reqs = [req("generate_until", p, {"until": ["\n\n"], "max_gen_toks": 6}) for p in prompts]
    together = lm.generate_until(reqs)
    alone = [lm.generate_until([r])[0] for r in reqs]
    assert together == alone


def test_static_cache_decoding_gives_the_same_texts(lm):
    """``decode=static`` (``kimi_vl.generation.GraphDecoder``'s static cache, eagerly: the path a GPU replays as a
    graph) writes what transformers' ``generate`` writes, with stop strings, batching and ``max_gen_toks``; a
    sampling request falls back to ``generate`` (its sampling defaults)."""
    from kimi_vl import KimiVLConfig, KimiVLForCausalLM

    with pytest.raises(ValueError, match="needs a kimi_vl model"):  # the fixture's model is transformers' own
        KimiVLLM(pretrained=lm.model, tokenizer=lm.tokenizer, device="cpu", decode="static")
    torch.manual_seed(0)
    model = KimiVLForCausalLM(KimiVLConfig.from_flavor("debug", vocab_size=lm.model.config.vocab_size)).eval()
    lm = KimiVLLM(pretrained=model, tokenizer=lm.tokenizer, batch_size=3, device="cpu")
    fast = KimiVLLM(pretrained=model, tokenizer=lm.tokenizer, batch_size=3, device="cpu", decode="static")
    assert lm.decode == "generate" and fast.decode == "static"  # auto on a CPU: generate
    prompts = ["Count the objects:", "Count the object:", "The red square is"]
    for until in ([], ["\n\n"]):
        reqs = [req("generate_until", p, {"until": until, "max_gen_toks": 9}) for p in prompts]
        assert fast.generate_until(reqs) == lm.generate_until(reqs)
    free = lm.generate_until([req("generate_until", prompts[0], {"until": [], "max_gen_toks": 12})])[0]
    assert len(free) >= 4, free
    stop = free[2:4]
    cut = fast.generate_until([req("generate_until", prompts[0], {"until": [stop], "max_gen_toks": 12})])[0]
    assert cut == free.split(stop)[0]
    sampled = {"until": [], "max_gen_toks": 4, "do_sample": True, "temperature": 0.9}
    torch.manual_seed(0)
    a = fast.generate_until([req("generate_until", prompts[0], sampled)])
    torch.manual_seed(0)
    assert a == lm.generate_until([req("generate_until", prompts[0], sampled)])  # both through generate
    with pytest.raises(ValueError, match="decode must be one of"):
        KimiVLLM(pretrained=lm.model, tokenizer=lm.tokenizer, device="cpu", decode="fast")


def test_loglikelihood_rolling_equals_manual_and_windows(lm):
    text = "Two cats and one dog sit on the fence."
    ids = lm.tok_encode(text)
    (total,) = lm.loglikelihood_rolling([req("loglikelihood_rolling", text)])
    assert total == pytest.approx(manual_logprob(lm, [lm.prefix_token_id], ids), abs=1e-4)
    short = KimiVLLM(pretrained=lm.model, tokenizer=lm.tokenizer, max_length=5, device="cpu")
    (windowed,) = short.loglikelihood_rolling([req("loglikelihood_rolling", text)])
    first = manual_logprob(lm, [lm.prefix_token_id], ids[:5])
    assert windowed < first and windowed != pytest.approx(total, abs=1e-3)


def test_visual_request_on_a_text_model_fails_clearly(lm):
    from PIL import Image

    image = Image.new("RGB", (56, 56), "red")
    with pytest.raises(ValueError, match="not a multimodal model"):
        lm.loglikelihood([req("loglikelihood", "<image> What colour?", " red", {"visual": [image]})])


TASKS = {
    "tiny_mc": """
task: tiny_mc
dataset_path: json
dataset_kwargs: {data_files: {test: "%(dir)s/mc.jsonl"}}
test_split: test
output_type: multiple_choice
doc_to_text: "{{question}} Answer:"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list: [{metric: acc}]
""",
    "tiny_gen": """
task: tiny_gen
dataset_path: json
dataset_kwargs: {data_files: {test: "%(dir)s/gen.jsonl"}}
test_split: test
output_type: generate_until
doc_to_text: "{{question}} Answer:"
doc_to_target: "{{answer}}"
generation_kwargs: {until: ["."], max_gen_toks: 8, do_sample: false}
metric_list: [{metric: exact_match}]
""",
    "tiny_ppl": """
task: tiny_ppl
dataset_path: json
dataset_kwargs: {data_files: {test: "%(dir)s/ppl.jsonl"}}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list: [{metric: word_perplexity}, {metric: bits_per_byte}]
""",
}


def write_tasks(d: Path) -> None:
    rows = {
        "mc.jsonl": [{"question": q, "choices": [" red", " blue", " green"], "label": i % 3}
                     for i, q in enumerate(["What colour is the square?", "What colour is the circle?",
                                            "Which colour is missing?", "Colour of the triangle?"])],
        "gen.jsonl": [{"question": q, "answer": a} for q, a in [("How many cats?", " two"), ("How many dogs?", " one"),
                                                                 ("What sits on the fence?", " birds")]],
        "ppl.jsonl": [{"text": t} for t in ["Two cats sit on the fence.", "The chart shows sales rising each year."]],
    }
    for name, docs in rows.items():
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in docs))
    for name, body in TASKS.items():
        (d / f"{name}.yaml").write_text(body % {"dir": d})


def test_kimi_vl_and_lm_eval_hf_agree_on_a_checkpoint(ckpt, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    write_tasks(tmp_path)
    tm = TaskManager(include_path=str(tmp_path), include_defaults=False)
    out = {}
    for model in ("kimi_vl", "hf"):
        arg = "checkpoint" if model == "kimi_vl" else "pretrained"
        out[model] = simple_evaluate(model=model, model_args=f"{arg}={ckpt},device=cpu", tasks=list(TASKS),
                                     task_manager=tm, batch_size=2, bootstrap_iters=0, log_samples=True)
    for task in TASKS:
        a, b = out["kimi_vl"]["samples"][task], out["hf"]["samples"][task]
        assert len(a) == len(b) > 0
        for sa, sb in zip(sorted(a, key=lambda s: s["doc_id"]), sorted(b, key=lambda s: s["doc_id"])):
            if task == "tiny_gen":
                assert sa["filtered_resps"] == sb["filtered_resps"], task
            else:
                ra = torch.tensor([r[0] if isinstance(r, (list, tuple)) else r for r in sa["filtered_resps"]])
                rb = torch.tensor([r[0] if isinstance(r, (list, tuple)) else r for r in sb["filtered_resps"]])
                assert torch.allclose(ra, rb, atol=1e-3), (task, ra, rb)
        ma, mb = out["kimi_vl"]["results"][task], out["hf"]["results"][task]
        for key, value in ma.items():
            if isinstance(value, float) and "stderr" not in key:
                assert value == pytest.approx(mb[key], rel=1e-3, abs=1e-6), (task, key)


def test_stop_strings_decode_only_the_tail_and_agree_with_whole_texts():
    """``StopStrings`` decodes only the newest tokens (plus a margin) at each call, yet reports exactly what a check
    of every row's whole new text reports, step by step: stop strings of several tokens, multi-byte characters,
    rows stopping at different steps; a new batch starts over."""
    import random

    from eval.lm_eval_model import StopStrings
    from tests.eval.tiny_lm import make_tokenizer

    tok = make_tokenizer()
    stops = ["Answer: 3", "\n\n", "héllo ☃"]
    rng = random.Random(0)
    pieces = ["The red square", " is left", " of", " the blue circle.", "\n", "Answer:", " 3", "é", "héllo", " ☃",
              " Count", " two cats"]
    prompt = tok.encode("Question: what colour?")
    found, open_rows = 0, 0
    for trial in range(20):
        rows = [prompt + tok.encode("".join(rng.choice(pieces) for _ in range(12))) for _ in range(3)]
        width = min(len(r) for r in rows)
        ids = torch.tensor([r[:width] for r in rows])
        crit = StopStrings(tok, stops, len(prompt))
        every = 1 + trial % 3  # called after every token, or after every 2 or 3 (several new tokens at once)
        for n in range(len(prompt) + every, width + 1, every):
            texts = tok.batch_decode(ids[:, len(prompt):n], skip_special_tokens=False)
            whole = torch.tensor([any(s in t for s in stops) for t in texts])
            assert torch.equal(crit(ids[:, :n]), whole), (n, texts)
        found, open_rows = found + int(whole.sum()), open_rows + int((~whole).sum())
    assert found > 5 and open_rows > 5  # both outcomes were exercised
    crit(ids[:, :len(prompt) + 1])  # shorter ids: another batch, checked from scratch
    assert crit.seen == 1
    assert not StopStrings(tok, [], len(prompt))(ids).any()  # no stop strings: never done
