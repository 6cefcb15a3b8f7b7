"""The KDA backward's dY, pair and inter kernels compile for the H100 (sm_90a) with Triton's compiler and ptxas, no
GPU needed, as the training path launches them (raw q, k rows of the q|k|v tensor with the forward's inverse norms,
the gate's backward inside the inter kernel: ``chunk_triton.BWD_FUSED_L2``, ``BWD_FUSED_GATE``): the interpreter runs
kernels as Python and cannot catch what only the compiler rejects. In a subprocess without ``TRITON_INTERPRET``, as
``test_short_conv_compiles``."""

from __future__ import annotations

import pytest
from kvl_testing import ptxas_lines

SCRIPT = """
from kernels.benchmarks.ptxas_regs import bwd_ptxas_report
for name, extra in (("dy", {}), ("pair", {}), ("inter", {}), ("inter", dict(LOWER=True, HAS_DTB=False))):
    print(name, extra, " | ".join(bwd_ptxas_report(name, **extra).splitlines()), flush=True)
"""


@pytest.mark.timeout(600)
def test_kda_bwd_kernels_compile_for_sm90():
    lines = ptxas_lines(SCRIPT, 4)
    for line in lines[2:]:  # the inter kernel (its gate epilogue included) keeps its registers without spills
        assert "0 bytes spill stores" in line, line
