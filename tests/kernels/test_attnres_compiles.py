"""The AttnRes mix and two-phase kernels compile for the H100 (sm_90a) with Triton's own compiler and ptxas, no GPU
needed: the interpreter runs them as Python and cannot catch what only the compiler rejects (compile-time branches,
loop-carried tuples of accumulators). In a subprocess without ``TRITON_INTERPRET`` (the test session sets it,
which turns every kernel into an interpreted function at import)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

SCRIPT = """
from kernels.benchmarks.ptxas_regs import attnres_ptxas_report, two_phase_ptxas_report
for kernel, defer in (("fwd", 0), ("bwd", 0), ("bwd", 3), ("flush", 0)):
    print(kernel, defer, " | ".join(attnres_ptxas_report(kernel, 3, defer=defer).splitlines()), flush=True)
for kernel, qpar in (("rows", True), ("rows", False), ("tiled", False), ("phase2", False)):
    print("two-phase", kernel, qpar, " | ".join(two_phase_ptxas_report(kernel, qpar=qpar).splitlines()), flush=True)
"""


@pytest.mark.timeout(600)
def test_attnres_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 8, proc.stdout
    for line in lines:
        assert "rror" not in line, line
        assert re.search(r"Used \d+ registers", line), line
    fwd = next(line for line in lines if line.startswith("fwd"))
    assert re.search(r"\b0 bytes spill stores", fwd), fwd  # (the backward spills 8 bytes at N = 3 with Triton 3.9)
