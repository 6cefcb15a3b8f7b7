"""The routed experts' backward writes each stacked expert gradient once (not once per expert).

Indexing the stacked ``[E, ...]`` parameter per expert made every expert's backward produce a zero gradient of
the whole parameter (E x the parameter's size of memory traffic per matrix; ~10 s per matrix on the CPU at the
`small` flavor's 64 x 512 x 768); ``unbind`` once gives one stacking backward with identical values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kimi_vl.modeling.moe import Experts


def _grad_fns(root) -> list[str]:
    seen, stack, names = set(), [root], []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.append(type(fn).__name__)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return names


def test_expert_weights_are_unbound_once_and_grads_match_reference():
    torch.manual_seed(0)
    experts = Experts(num_experts=6, hidden_size=16, intermediate_size=8)
    for p in (experts.gate_proj, experts.up_proj, experts.down_proj):
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(10, 16)
    idx = torch.randint(0, 5, (10, 2))  # expert 5 gets no token
    w = torch.rand(10, 2)
    out = experts(x, idx, w)
    names = _grad_fns(out.grad_fn)
    assert names.count("UnbindBackward0") == 3 and "SelectBackward0" not in names
    out.square().sum().backward()
    got = [p.grad.clone() for p in (experts.gate_proj, experts.up_proj, experts.down_proj)]
    params = [p.detach().clone().requires_grad_() for p in (experts.gate_proj, experts.up_proj, experts.down_proj)]
    ref = torch.zeros_like(x)
    for t in range(10):
        for j in range(2):
            e = int(idx[t, j])
            h = F.silu(params[0][e] @ x[t]) * (params[1][e] @ x[t])
            ref[t] = ref[t] + w[t, j] * (params[2][e] @ h)
    ref.square().sum().backward()
    for g, p in zip(got, params):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-6)
    assert got[0][5].abs().sum() == 0
