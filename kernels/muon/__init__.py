"""Fused elementwise passes of the Muon optimizer step (Triton, each beside its PyTorch reference).

Used by ``kimi_vl.optim`` (the maths of Muon lives there); see :mod:`kernels.muon.fused`.
"""
