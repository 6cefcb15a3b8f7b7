"""Reference Attention-Residual mix over depth (``../shared/REFERENCE.md`` section 3): the specification.

    keys k_n = RMSNorm(x_n) * gain,   s_n = w . k_n,   alpha = softmax_n(s)  (fp32),   h = sum_n alpha_n x_n

Stacks the sources (``[N, *, D]``), so it costs a copy of all of them; tests and small inputs only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def attn_res_mix_naive(sources: Sequence[torch.Tensor], weight: torch.Tensor, gain: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h [*, D] in the dtype of sources[0], alpha [N, *] fp32)``; fp64 sources compute in fp64."""
    wide = torch.float64 if sources[0].dtype == torch.float64 else torch.float32
    v_ND = torch.stack([s.to(wide) for s in sources])  # [N, *, D]
    rstd = torch.rsqrt(v_ND.pow(2).mean(-1, keepdim=True) + eps)
    keys = v_ND * rstd * gain.to(wide)
    alpha = torch.softmax(keys @ weight.to(wide).reshape(-1), dim=0)  # [N, *]
    h = (alpha[..., None] * v_ND).sum(0)
    return h.to(sources[0].dtype), alpha
