"""MoonViT architecture configs and named flavors (REFERENCE.md section 5).

``so400m`` is the released MoonViT shape (Kimi-VL / Kimi K2.5: width 1152, 27 layers, 16 heads, MLP 4304,
~417M trunk parameters plus the projector). ``debug`` runs CPU tests in milliseconds; ``tiny`` is the CPU
quickstart encoder; ``small`` is a research-scale ViT-S-like trunk.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

ATTENTION_BACKENDS = ("auto", "varlen", "masked", "loop")


@dataclass(frozen=True)
class MoonViTConfig:
    """Shape and numerics of the MoonViT trunk, merger and projector.

    ``out_hidden_size`` is the language model's width (projector output); ``None`` builds no projector.
    ``attention_backend``: ``auto`` = varlen flash on CUDA in bf16/fp16, else block-diagonal masked SDPA
    (``loop`` over images when the packed sequence is long); see ``model.MoonViTAttention``.
    ``row_bucket``: on the ``varlen`` and ``loop`` backends the packed rows (and the projector's merged tokens,
    ``row_bucket / merge_size**2`` of them) are padded up to a multiple of it with one extra attention segment, so
    that the trunk's GEMMs see a few shapes instead of a new one every batch: cuBLAS picks an algorithm per new
    shape, and on an H100 a ``torch.mm`` of a new shape took 157 us of host time against 20-29 us for one it has
    seen (489 against 28 with cuBLASLt; ``kernels/benchmarks/host_costs.py``, session 8 call2). The padding rows
    never reach a real token (own segment, row-wise layers) nor the QK-Clip statistic; ``0`` or ``1`` turns it
    off.
    """

    hidden_size: int = 1152
    num_layers: int = 27
    num_heads: int = 16
    intermediate_size: int = 4304
    patch_size: int = 14
    in_channels: int = 3
    pos_emb_height: int = 64
    pos_emb_width: int = 64
    pos_emb_time: int = 4
    merge_size: int = 2
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    out_hidden_size: int | None = None
    projector_norm_eps: float = 1e-5
    attention_backend: str = "auto"
    masked_attention_max_len: int = 8192
    initializer_range: float = 0.02
    row_bucket: int = 256

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}")
        if self.head_dim % 4:
            raise ValueError(f"head_dim={self.head_dim} must be divisible by 4 for 2-D RoPE")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend={self.attention_backend!r} not in {ATTENTION_BACKENDS}")
        for name in ("num_layers", "intermediate_size", "patch_size", "pos_emb_height", "pos_emb_width",
                     "pos_emb_time", "merge_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoonViTConfig.{name} must be >= 1, got {getattr(self, name)}")

        if self.row_bucket < 0 or (self.row_bucket > 1 and self.row_bucket % self.merge_size**2):
            raise ValueError(f"MoonViTConfig.row_bucket must be 0, 1 or a positive multiple of merge_size**2="
                             f"{self.merge_size**2}, got {self.row_bucket}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merged_size(self) -> int:
        """Width of one merged token before the projector: ``merge_size**2 * hidden_size``."""
        return self.merge_size**2 * self.hidden_size

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> MoonViTConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown MoonViTConfig keys {unknown}; known: {sorted(known)}")
        return cls(**data)


FLAVORS: dict[str, MoonViTConfig] = {
    "debug": MoonViTConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, pos_emb_height=8,
                           pos_emb_width=8),
    "tiny": MoonViTConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, pos_emb_height=16,
                          pos_emb_width=16),
    "small": MoonViTConfig(hidden_size=384, num_layers=12, num_heads=6, intermediate_size=1536),
    "so400m": MoonViTConfig(),
}


def moonvit_config(flavor: str, **overrides: object) -> MoonViTConfig:
    """The named flavor, with ``overrides`` applied (unknown keys raise ``TypeError`` from ``replace``)."""
    if flavor not in FLAVORS:
        raise ValueError(f"unknown MoonViT flavor {flavor!r}; choose from {sorted(FLAVORS)}")
    return replace(FLAVORS[flavor], **overrides)
