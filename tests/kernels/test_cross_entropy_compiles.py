"""The cross entropy's loss + gradient kernels (each form of ``ce_triton.FWD_GRAD_MODE``) and the linear CE's row
scaling compile for the H100 (sm_90a) with Triton's compiler and ptxas, no GPU needed, as ``ce_forward_grad_`` and
``scale_rows`` launch them; the whole-row form at the small model's 32768 classes holds its row in 64 registers a
thread without spills (32 warps: 1024 threads, the register file's limit). In a subprocess without
``TRITON_INTERPRET``, as ``test_kda_bwd_compiles``."""

from __future__ import annotations

import re

import pytest
from kvl_testing import ptxas_lines

SCRIPT = """
from kernels.benchmarks.ptxas_regs import ce_ptxas_report
for kernel in ("row", "chunks", "persistent", "scale_rows"):
    print(kernel, " | ".join(ce_ptxas_report(kernel).splitlines()), flush=True)
"""


@pytest.mark.timeout(600)
def test_cross_entropy_kernels_compile_for_sm90():
    lines = ptxas_lines(SCRIPT, 4)
    for line in lines:
        assert "0 bytes spill stores" in line, line
    assert int(re.search(r"Used (\d+) registers", lines[0]).group(1)) <= 64, lines[0]  # else 1024 threads can't launch
