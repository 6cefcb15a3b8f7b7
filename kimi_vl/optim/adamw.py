"""The AdamW half of MuonClip as pure functions, bit-identical to ``torch.optim.AdamW(foreach=False)``
(and :func:`adamw_update_fused_` to ``torch.optim.AdamW(fused=True)``).

Source: Loshchilov & Hutter, "Decoupled Weight Decay Regularization"; the operation order follows
torch's single-tensor AdamW so results match it exactly:

    W <- W (1 - lr wd);  m <- lerp(m, g, 1 - b1);  v <- b2 v + (1 - b2) g^2
    W <- W - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
"""

from __future__ import annotations

import torch


def adamw_update_(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int | float,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> None:
    """One AdamW step on one tensor, in place (``step`` is the count after this step, starting at 1)."""
    beta1, beta2 = betas
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-(lr / bias_correction1))


def adamw_update_foreach_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    step: int | float,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> None:
    """:func:`adamw_update_` over a list of same-device tensors sharing one step count (fewer kernel launches)."""
    if not params:
        return
    beta1, beta2 = betas
    if weight_decay != 0:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    denoms = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denoms, bias_correction2_sqrt)
    torch._foreach_add_(denoms, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denoms, value=-(lr / bias_correction1))


def adamw_update_fused_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> None:
    """One fused kernel (``torch._fused_adamw_``) over same-device tensors; ``steps`` are per-tensor fp32 step
    counts on that device, incremented here. Bit-identical to ``torch.optim.AdamW(fused=True)``; it differs
    from the unfused order above by rounding only, and it never syncs with the host."""
    if not params:
        return
    torch._foreach_add_(steps, 1)
    torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=lr, beta1=betas[0],
                        beta2=betas[1], weight_decay=weight_decay, eps=eps, maximize=False)
