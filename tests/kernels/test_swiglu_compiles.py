"""The SwiGLU GEMM kernels (``kernels/swiglu``) compile for the H100 (sm_90a) with Triton's compiler and ptxas, no GPU
needed, at their default tilings (``GPU_CONFIG``) and bf16 with the model's sizes divisible by 16: no spills, loads
software-pipelined through shared memory (``cp.async``) and Hopper's asynchronous MMA (``wgmma``). In a subprocess
without ``TRITON_INTERPRET``, as ``test_kda_bwd_compiles``."""

from __future__ import annotations

import re

import pytest
from kvl_testing import ptxas_lines

SCRIPT = """
from kernels.benchmarks.ptxas_regs import swiglu_ptxas_report
for kind in ("fwd", "bwd"):
    print(kind, " | ".join(swiglu_ptxas_report(kind).splitlines()), flush=True)
"""


@pytest.mark.timeout(600)
def test_swiglu_kernels_compile_for_sm90_without_spills():
    for line in ptxas_lines(SCRIPT, 2):
        assert "0 bytes spill stores" in line, line
        assert int(re.search(r"(\d+) cp.async copies", line).group(1)) > 0, line
        assert int(re.search(r"(\d+) wgmma", line).group(1)) > 0, line
