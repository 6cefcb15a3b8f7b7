"""QK-Clip stress demo on CPU: plain Muon's max attention logit runs away, MuonClip's stays near tau.

Source: Kimi K2 technical report (max logits past 1000 without QK-Clip; capped at tau with it).
A tiny causal MHA language model (implementing the QK-Clip protocol of docs/INTERFACES.md) learns an
induction/copy task (a random half-sequence followed by its repeat) with a high learning rate and no
weight decay, once with ``qk_clip=false`` (max logits only tracked) and once with ``qk_clip=true``.
It writes ``stress.json`` (per-step max logit and loss for both arms) and ``stress.png``.

Run (settings are ``key=value`` overrides of :class:`StressConfig`)::

    python -m kimi_vl.optim.qk_clip_stress --out kimi_vl/optim/figures lr=0.02 steps=400 tau=5
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kernels.qk_max import max_logits_per_head
from kernels.qk_max.scale import scale_rows_
from kimi_vl.optim.builder import OptimConfig, build_optimizer
from kimi_vl.runconfig import load_config, to_dict


@dataclass
class StressConfig:
    steps: int = 400
    seed: int = 0
    vocab: int = 64
    d_model: int = 32
    num_heads: int = 4
    layers: int = 2
    seq_len: int = 32
    batch: int = 8
    lr: float = 0.02
    weight_decay: float = 0.0
    tau: float = 5.0


class StressAttention(nn.Module):
    """Causal MHA with the QK-Clip protocol (MHA rule: q and k rows by sqrt(gamma))."""

    def __init__(self, d: int, num_heads: int) -> None:
        super().__init__()
        self.h, self.dh = num_heads, d // num_heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.qkv.muon_row_splits = {"weight": (d, d, d)}
        self.o = nn.Linear(d, d, bias=False)
        self.qk_clip_num_heads = num_heads
        self.track_max_logits = False
        self.register_buffer("max_logits_H", torch.full((num_heads,), float("-inf")), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, self.dh).unbind(2)  # [B, T, H, Dh] each
        if self.track_max_logits:
            with torch.no_grad():
                step_max = max_logits_per_head(q, k, self.dh**-0.5, causal=True)
                self.max_logits_H.copy_(torch.maximum(self.max_logits_H, step_max))
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.o(o.transpose(1, 2).reshape(B, T, d))

    @torch.no_grad()
    def qk_clip_(self, gamma_H: torch.Tensor) -> None:
        d = self.h * self.dh
        rows = torch.cat([gamma_H.sqrt().repeat_interleave(self.dh)] * 2 + [torch.ones(d)])
        scale_rows_(self.qkv.weight, rows)


class StressLM(nn.Module):
    def __init__(self, c: StressConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.pos_emb = nn.Parameter(torch.randn(c.seq_len, c.d_model) * 0.02)
        self.norms = nn.ModuleList(nn.RMSNorm(c.d_model) for _ in range(2 * c.layers))
        self.attn = nn.ModuleList(StressAttention(c.d_model, c.num_heads) for _ in range(c.layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(c.d_model, 4 * c.d_model), nn.GELU(), nn.Linear(4 * c.d_model, c.d_model))
            for _ in range(c.layers))
        self.norm = nn.RMSNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos_emb[: ids.shape[1]]
        for i, (attn, mlp) in enumerate(zip(self.attn, self.mlp)):
            x = x + attn(self.norms[2 * i](x))
            x = x + mlp(self.norms[2 * i + 1](x))
        return self.lm_head(self.norm(x))


def copy_batch(c: StressConfig, g: torch.Generator) -> torch.Tensor:
    half = torch.randint(0, c.vocab, (c.batch, c.seq_len // 2), generator=g)
    return torch.cat([half, half], dim=1)  # [B, T]: the second half is predictable only by attending back


def run_arm(c: StressConfig, qk_clip: bool) -> dict[str, list[float]]:
    torch.manual_seed(c.seed)
    model = StressLM(c)
    cfg = OptimConfig(lr=c.lr, weight_decay=c.weight_decay, qk_clip=qk_clip, qk_clip_tau=c.tau, ns_dtype="float32")
    opt = build_optimizer(model, cfg)
    g = torch.Generator().manual_seed(c.seed + 1)
    out: dict[str, list[float]] = {"max_logit": [], "loss": [], "clipped_heads": []}
    for _ in range(c.steps):
        ids = copy_batch(c, g)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, c.vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        stats = opt.last_qk_stats.to_dict(per_layer=False)
        out["max_logit"].append(stats["qk_clip/max_logit"])
        out["clipped_heads"].append(stats["qk_clip/clipped_heads"])
        out["loss"].append(loss.item())
    return out


def plot(result: dict, c: StressConfig, path: Path, command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, style in (("muon", "-"), ("muonclip", "-")):
        a0.plot(result[arm]["max_logit"], style, label=arm)
        a1.plot(result[arm]["loss"], style, label=arm)
    a0.axhline(c.tau, color="k", ls="--", lw=0.8, label=f"tau = {c.tau:g}")
    a0.axhline(10 * c.tau, color="r", ls=":", lw=0.8, label="10 tau")
    a0.set_yscale("log")
    a0.set_xlabel("step")
    a0.set_ylabel("max pre-softmax logit (all layers, heads)")
    a1.set_xlabel("step")
    a1.set_ylabel("training loss (copy task)")
    a0.legend()
    a1.legend()
    fig.suptitle(f"QK-Clip stress: lr={c.lr:g}, wd={c.weight_decay:g}, d={c.d_model}, heads={c.num_heads}\n{command}",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kimi_vl.optim.qk_clip_stress", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for stress.json and stress.png")
    parser.add_argument("overrides", nargs="*", help="key=value settings of StressConfig")
    args = parser.parse_args(argv)
    c = load_config(StressConfig, None, args.overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    result = {"config": to_dict(c), "muon": run_arm(c, qk_clip=False), "muonclip": run_arm(c, qk_clip=True)}
    result["seconds"] = time.time() - t0
    command = "python -m kimi_vl.optim.qk_clip_stress --out " + " ".join([args.out, *args.overrides])
    result["command"] = command
    (out / "stress.json").write_text(json.dumps(result))
    plot(result, c, out / "stress.png", command)
    for arm in ("muon", "muonclip"):
        ml = result[arm]["max_logit"]
        print(f"{arm:9s} max logit: peak {max(ml):9.1f} final {ml[-1]:9.1f} (tau {c.tau:g}); "
              f"final loss {result[arm]['loss'][-1]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
