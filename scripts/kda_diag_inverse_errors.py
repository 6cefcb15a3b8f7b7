"""fp32 error of the three forms of the scores kernel's diagonal 16 x 16 inverse ``(I + A)^-1`` (A strictly lower,
``A_ij = beta k_i . k_j``, no decay) against fp64, in PyTorch with the kernel's arithmetic: forward substitution,
products of powers over the whole block ``(I - A)(I + A^2)(I + A^4)(I + A^8)``, and products over the two 8 x 8
halves then ``X - X Ao X`` (``kernels/kda/scores_triton.py``: ``_inv_diag4``, ``_inv_diag4_products``). Keys are
drawn around a shared direction with the given cosine weight; prints the largest relative Frobenius error of each
form over the trials (CPU, seconds).

    python scripts/kda_diag_inverse_errors.py --trials 50
"""

from __future__ import annotations

import argparse

import torch


def substitution(a: torch.Tensor) -> torch.Tensor:
    x = torch.eye(a.shape[-1], dtype=a.dtype)
    for i in range(1, a.shape[-1]):
        x[i] = x[i] - a[i, :i] @ x[:i]
    return x


def products_whole(a: torch.Tensor) -> torch.Tensor:
    a2 = a @ a
    a4 = a2 @ a2
    x = torch.eye(a.shape[-1], dtype=a.dtype) - a
    x = x + x @ a2
    x = x + x @ a4
    return x + x @ (a4 @ a4)


def products_halves(a: torch.Tensor) -> torch.Tensor:
    r = torch.arange(a.shape[-1])
    same = (r[:, None] // (a.shape[-1] // 2)) == (r[None, :] // (a.shape[-1] // 2))
    ab, ao = a * same, a * ~same
    a2 = ab @ ab
    x = torch.eye(a.shape[-1], dtype=a.dtype) - ab
    x = x + x @ a2
    x = x + x @ (a2 @ a2)
    return x - x @ (ao @ x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    forms = {"substitution": substitution, "products, whole block": products_whole,
             "products, 8 x 8 halves": products_halves}
    for label, corr, beta in [("random keys, beta 0.5", 0.0, 0.5), ("cosine weight 0.9, beta 1", 0.9, 1.0),
                              ("cosine weight 0.99, beta 1", 0.99, 1.0), ("cosine weight 0.999, beta 1", 0.999, 1.0)]:
        worst = dict.fromkeys(forms, 0.0)
        for _ in range(args.trials):
            k = corr * torch.randn(128, dtype=torch.float64) + (1 - corr) * torch.randn(16, 128, dtype=torch.float64)
            k = k / k.norm(dim=1, keepdim=True)
            a = torch.tril(beta * (k @ k.T), -1)
            exact = torch.linalg.inv(torch.eye(16, dtype=torch.float64) + a)
            for name, fn in forms.items():
                err = ((fn(a.float()).double() - exact).norm() / exact.norm()).item()
                worst[name] = max(worst[name], err)
        print(f"{label:28s} " + "  ".join(f"{n} {e:.1e}" for n, e in worst.items()))


if __name__ == "__main__":
    main()
