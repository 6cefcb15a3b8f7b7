"""The short conv's one-kernel backwards (ring and stream) compile for the H100 (sm_90a) with Triton's compiler and
ptxas, no GPU needed, the ring at tiles whose row count differs from the halo's (``BT != BW``): the interpreter ran a
version that the compiler rejected there (a name assigned before the tile loop and in it is one loop-carried value,
so its shape must not change; session 28, call4). In a subprocess without ``TRITON_INTERPRET``, as
``test_attnres_compiles``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

SCRIPT = """
from kernels.benchmarks.ptxas_regs import conv_bwd_ptxas_report, conv_bwd_stream_ptxas_report
for bt, w, state, bias, dfs in ((4, 4, False, False, False), (8, 4, True, True, True), (16, 2, False, True, False),
                                (8, 8, True, False, True)):
    print(bt, w, " | ".join(conv_bwd_ptxas_report(bt, w, state=state, bias=bias, dfs=dfs).splitlines()), flush=True)
for w, varlen, state, dfs in ((4, False, False, False), (4, True, True, True), (2, True, False, True)):
    print("stream", w, " | ".join(conv_bwd_stream_ptxas_report(w, varlen=varlen, state=state, dfs=dfs).splitlines()),
          flush=True)
"""


@pytest.mark.timeout(600)
def test_conv_bwd_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 7, proc.stdout
    for line in lines:
        assert "rror" not in line, line
        assert re.search(r"Used \d+ registers", line), line
