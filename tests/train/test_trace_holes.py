"""``kimi_vl.benchmarks.trace_holes`` on a hand-made Chrome trace: the GPU's holes (streams merged) and the host
events of every thread that overlap them."""

from __future__ import annotations

import gzip
import json

from kimi_vl.benchmarks.trace_holes import holes, host_in, load, main

EVENTS = [
    {"ph": "X", "cat": "kernel", "name": "k1", "ts": 0, "dur": 100, "tid": 7},
    {"ph": "X", "cat": "kernel", "name": "k2", "ts": 50, "dur": 100, "tid": 8},  # overlaps k1 on another stream
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 2150, "dur": 10, "tid": 7},  # 2000 us hole
    {"ph": "X", "cat": "kernel", "name": "k3", "ts": 2200, "dur": 10, "tid": 7},  # 40 us gap: below 1000
    {"ph": "X", "cat": "cpu_op", "name": "CastParams", "ts": 100, "dur": 2000, "tid": 1},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaHostAlloc", "ts": 500, "dur": 1500, "tid": 2},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 2300, "dur": 5, "tid": 1},  # after the hole
]


def test_holes_merge_streams_and_keep_the_long_ones():
    assert holes(EVENTS, 1000) == [(150, 2150, "Memcpy HtoD")]
    assert len(holes(EVENTS, 20)) == 2
    assert holes([e for e in EVENTS if e["cat"] == "cpu_op"], 20) == []


def test_host_events_in_a_hole_by_thread(tmp_path, capsys):
    found = host_in(EVENTS, 150, 2150)
    assert [e[3] for e in found[1]] == ["CastParams"] and [e[3] for e in found[2]] == ["cudaHostAlloc"]
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": EVENTS}, f)
    assert load(str(path)) == EVENTS
    main([str(path), "--min-us", "1000"])
    out = capsys.readouterr().out
    assert "1 holes >= 1000 us, 2.0 ms in all" in out and "hole 2000 us at 150, then Memcpy HtoD" in out
    assert "cuda_runtime    cudaHostAlloc" in out
