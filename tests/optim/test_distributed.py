"""Distributed MuonClip (DDP owner scheme, FSDP2 DTensor params) equals single-process, 2-process gloo on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("dist_worker.py")


def test_two_process_ddp_and_fsdp2_match_single_process() -> None:
    """One spawn runs both cases (process start-up dominates the time): DDP owner scheme, then FSDP2."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(WORKER), "all", "2"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "ddp: world 2" in proc.stdout and "fsdp2: world 2" in proc.stdout
