"""``eval.bench_decode`` on a CPU: both applications (web demo, lm-eval) time ``generate`` and the static-cache
decoder, write the JSON, and in fp32 the static cache writes exactly ``generate``'s greedy texts."""

from __future__ import annotations

import json

from eval.bench_decode import common_prefix, main

ARGV = ["--flavor", "debug", "--vision-flavor", "debug", "--device", "cpu", "--dtype", "float32",
        "--max-new-tokens", "8", "--rounds", "1", "--lm-requests", "2", "--lm-batch", "2", "--prompt-tokens", "32",
        "--max-patches", "64", "--decodes", "generate", "static"]


def test_bench_decode_cpu_static_equals_generate(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    returned = main(ARGV)
    saved = json.loads((tmp_path / "bench_decode.json").read_text())
    assert saved["args"]["decodes"] == ["generate", "static"] and saved["device"] == "cpu"
    assert saved["lm_eval_prompt_tokens"] == 32
    for part, texts in (("demo", 1), ("lm_eval", 2)):
        assert set(saved[part]) == {"generate", "static"}, part
        for decode, res in saved[part].items():
            assert res["decode"] == decode
            assert len(res["rounds"]) == 1 and len(res["texts"]) == texts
            assert res["best_tokens_per_s"] > 0 and res["median_tokens_per_s"] > 0, (part, decode)
            assert all(r["new_tokens"] > 0 and r["seconds"] > 0 for r in res["rounds"])
        # the real check: the static cache's greedy tokens are generate's (fp32 on a CPU)
        assert saved[part]["static"]["texts"] == saved[part]["generate"]["texts"], part
        assert saved[part]["static"]["texts_equal"] is True and saved[part]["generate"]["texts_equal"] is True
    lm = saved["lm_eval"]["generate"]
    assert lm["token_count"] == "decoded ids"  # counted from the generated ids, not estimated from the texts
    assert all(r["new_tokens"] <= 2 * 8 for r in lm["rounds"])
    assert returned["demo"]["static"]["texts"] == saved["demo"]["static"]["texts"]
    out = capsys.readouterr().out
    assert "| part | decode | tokens/s (best) |" in out and "| lm_eval | static |" in out
    assert "[demo] static" in out and "[lm_eval] generate" in out


def test_common_prefix() -> None:
    assert common_prefix("abcd", "abxd") == 2 and common_prefix("ab", "abc") == 2 and common_prefix("", "a") == 0
