"""The short conv's one-kernel backward compiles for the H100 (sm_90a) with Triton's compiler and ptxas, no GPU
needed: the interpreter runs kernels as Python and cannot catch what only the compiler rejects (session 28, call4:
a removed variant of this kernel assigned a name before its tile loop and in it, one loop-carried value of two
shapes, and ran in the interpreter). In a subprocess without ``TRITON_INTERPRET``, as ``test_attnres_compiles``."""

from __future__ import annotations

import pytest
from kvl_testing import ptxas_lines

SCRIPT = """
from kernels.benchmarks.ptxas_regs import conv_bwd_stream_ptxas_report
for w, varlen, state, bias, dfs in ((4, False, False, False, False), (4, True, True, True, True),
                                    (2, True, False, False, True), (8, True, True, True, False)):
    report = conv_bwd_stream_ptxas_report(w, varlen=varlen, state=state, bias=bias, dfs=dfs)
    print("stream", w, " | ".join(report.splitlines()), flush=True)
"""


@pytest.mark.timeout(600)
def test_conv_bwd_kernel_compiles_for_sm90():
    ptxas_lines(SCRIPT, 4)
