"""kimi_vision_tooluse: the well-formed-call check (hand cases and real transcripts), the written task, the
metric through lm-eval, and the kimi_vl model keeping special tokens when a task asks for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from scripted_lm import scripted_lm

from data_pipelines.synth import generate_sample, get_preset
from data_pipelines.tokenizer import render_chat
from eval.tasks import SuiteSpec, write_suites
from eval.tasks.doc_funcs import process_tooluse, well_formed_tool_call
from eval.tasks.tooluse import TOOLUSE_TASK

SB, CB, AB, CE, SE = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                      "<|tool_call_end|>", "<|tool_calls_section_end|>")


def call(code: str = 'print(img.size)', name: str = "python", index: int = 0, args: str | None = None) -> str:
    return f"{CB}functions.{name}:{index}{AB}{args if args is not None else json.dumps({'code': code})}{CE}"


@pytest.mark.parametrize("text, ok", [
    ("I will count." + SB + call() + SE, True),
    (SB + call() + call(index=1) + SE + " trailing text", True),
    (SB + call() + " \n " + call(index=1) + SE, True),
    ("just an answer: 3", False),
    (SB + call(), False),                                   # section never closed (ran out of tokens)
    (SB + SE, False),                                       # no call
    (SB + call(name="shell") + SE, False),                  # another tool
    (SB + call(args='{"code": 3}') + SE, False),            # code is not a string
    (SB + call(args='{"code": "x"') + SE, False),           # invalid JSON
    (SB + call(args='["print(1)"]') + SE, False),           # not an object
    (SB + "chatter" + call() + SE, False),                  # text between calls
    (SB + f"{CB}functions.python:0{{\"code\": \"x\"}}{CE}" + SE, False),  # no argument marker
    (SB + call() + call(args="oops") + SE, False),          # one bad call voids the section
])
def test_well_formed_tool_call_hand_cases(text, ok):
    assert well_formed_tool_call(text) is ok
    assert process_tooluse({}, [text]) == {"tool_call": float(ok), "tool_attempt": float(CB in text or SB in text)}


def test_real_transcripts_are_well_formed_and_answers_are_not():
    preset = get_preset("tiny")
    for i in range(6):
        s = generate_sample(preset, 0, "test", "tool_sft", i)
        turns = [m for m in s.messages if m["role"] == "assistant"]
        first = "".join(t for t, _, _ in render_chat([turns[0]], train_on="none"))
        body = first.split("<|im_middle|>", 1)[1].removesuffix("<|im_end|>")
        assert well_formed_tool_call(body), body
        last = "".join(t for t, _, _ in render_chat([turns[-1]], train_on="none"))
        assert not well_formed_tool_call(last.split("<|im_middle|>", 1)[1])


@pytest.fixture(scope="module")
def vision_suite(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vision")
    tasks = write_suites(SuiteSpec(out, n_per_family=3), ("kimi_vision",))
    assert TOOLUSE_TASK in tasks["kimi_vision"]
    return out


def test_written_rows_mirror_the_transcript_format(vision_suite):
    rows = [json.loads(x) for x in (vision_suite / "kimi_vision" / f"{TOOLUSE_TASK}.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 3 and {r["family"] for r in rows} == {"shapes", "ocr", "chart", "document"}
    for r in rows:
        assert r["prompt"].startswith("<|im_system|>system<|im_middle|>You can run Python on an image")
        assert r["prompt"].endswith("<|im_assistant|>assistant<|im_middle|>") and r["prompt"].count("<image>") == 1
        assert Path(r["images"][0]).is_file()
    group = (vision_suite / "kimi_vision" / "kimi_vision.yaml").read_text()
    assert TOOLUSE_TASK not in group  # run on purpose only (experiment 7)


def test_tool_use_rate_through_lm_eval(vision_suite):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    seen = []

    def scripted(requests):
        out = []
        for r in requests:
            seen.append(r.args[1])
            assert len(r.args[2]["visual"]) == 1
            k = len(out) % 3
            out.append(["I will look." + SB + call() + SE, SB + call(), "4"][k])
        return out

    tm = TaskManager(include_path=str(vision_suite), include_defaults=False)
    res = simple_evaluate(model=scripted_lm(generate_until=scripted, multimodal=True), tasks=[TOOLUSE_TASK],
                          task_manager=tm, bootstrap_iters=0)
    m = res["results"][TOOLUSE_TASK]
    assert m["tool_call,none"] == pytest.approx(4 / 12) and m["tool_attempt,none"] == pytest.approx(8 / 12)
    assert seen[0]["until"] == ["<|im_end|>"] and seen[0]["keep_special_tokens"] is True


class FixedGenerator(torch.nn.Module):
    """Appends fixed ids to the context (stands in for a model whose greedy output is known)."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__()
        self.ids = ids
        self.config = type("Cfg", (), {"max_position_embeddings": 256})()

    def forward(self, input_ids=None, attention_mask=None):
        raise AssertionError("generate_until must go through generate(), not forward()")

    def generate(self, input_ids, max_new_tokens, **kwargs):
        extra = torch.tensor([self.ids[:max_new_tokens]] * input_ids.shape[0], dtype=torch.long)
        return torch.cat([input_ids, extra], dim=1)


def test_kimi_vl_keeps_special_tokens_only_when_asked():
    from lm_eval.api.instance import Instance
    from tiny_lm import make_tokenizer

    from eval.lm_eval_model import KimiVLLM

    tok = make_tokenizer()
    ids = tok.encode("red<|media_begin|>x<|media_end|>\nmore", add_special_tokens=False)
    lm = KimiVLLM(pretrained=FixedGenerator(ids), tokenizer=tok, device="cpu")

    def gen(kwargs):
        req = Instance("generate_until", {}, ("Question: ?", kwargs), 0)
        return lm.generate_until([req], disable_tqdm=True)[0]

    assert gen({"until": ["\n"], "max_gen_toks": 16}) == "redx"
    assert gen({"until": ["\n"], "max_gen_toks": 16, "keep_special_tokens": True}) == "red<|media_begin|>x<|media_end|>"
