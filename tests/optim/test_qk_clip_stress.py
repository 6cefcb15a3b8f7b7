"""The QK-Clip stress demo's claim (issue 7): at the demo's settings plain Muon's max logit passes 10 tau within a
few hundred steps, while MuonClip holds the logged (pre-clip) max at ~1.1 tau (median over the second half)."""

from __future__ import annotations

import statistics

import torch

from kimi_vl.optim.qk_clip_stress import StressConfig, run_arm


def test_stress_plain_muon_runs_away_muonclip_holds_tau() -> None:
    torch.set_num_threads(1)
    c = StressConfig()  # lr 0.02, tau 5, 400 steps: the committed figure's settings
    plain = run_arm(c, qk_clip=False)["max_logit"]
    clipped = run_arm(c, qk_clip=True)["max_logit"]
    first_past = next((i for i, x in enumerate(plain) if x > 10 * c.tau), None)
    assert first_past is not None and first_past < 400, f"plain Muon never passed 10 tau (peak {max(plain):.1f})"
    half = len(clipped) // 2
    median = statistics.median(clipped[half:])
    assert median <= 1.12 * c.tau, f"MuonClip second-half median max logit {median:.2f} > 1.12 tau"
    assert max(clipped[half:]) <= 1.6 * c.tau
