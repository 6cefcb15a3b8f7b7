"""The short conv's one-kernel backward compiles for the H100 (sm_90a) with Triton's compiler and ptxas, no GPU
needed: the interpreter runs kernels as Python and cannot catch what only the compiler rejects (session 28, call4:
a removed variant of this kernel assigned a name before its tile loop and in it, one loop-carried value of two
shapes, and ran in the interpreter). In a subprocess without ``TRITON_INTERPRET``, as ``test_attnres_compiles``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

SCRIPT = """
from kernels.benchmarks.ptxas_regs import conv_bwd_stream_ptxas_report
for w, varlen, state, bias, dfs in ((4, False, False, False, False), (4, True, True, True, True),
                                    (2, True, False, False, True), (8, True, True, True, False)):
    report = conv_bwd_stream_ptxas_report(w, varlen=varlen, state=state, bias=bias, dfs=dfs)
    print("stream", w, " | ".join(report.splitlines()), flush=True)
"""


@pytest.mark.timeout(600)
def test_conv_bwd_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 4, proc.stdout
    for line in lines:
        assert "rror" not in line, line
        assert re.search(r"Used \d+ registers", line), line
