"""FSDP2 MuonClip's bf16 update == one process's for the same gradient, bitwise (issue 7), 2-process gloo on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("fsdp_same_grad_worker.py")


def test_fsdp2_bf16_update_equals_one_process_for_the_same_gradient() -> None:
    """Exact PyTorch path and the fused Triton path (interpreter): only the optimizer code paths differ."""
    pytest.importorskip("triton")
    env = dict(os.environ, OMP_NUM_THREADS="1", TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(WORKER), "all", "2"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "fsdp2 exact bf16 same-grad" in proc.stdout and "fsdp2 fused bf16 same-grad" in proc.stdout, proc.stdout
