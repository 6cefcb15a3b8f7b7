"""MoonViT / MoonViT-3D: a native-resolution, packed ViT encoder for images and video chunks.

REFERENCE.md section 5; numerically equal to transformers' ``Kimi_K25VisionModel`` (+ projector) after
``vision_encoder.convert`` maps the keys. Pipeline over a packed batch:

    pixel_values [P, 3, 14, 14] --Conv2d--> [P, W]
      + learned [64, 64, W] table bicubic-resampled to each chunk's (h, w), repeated over t
      + fixed sin-cos time embedding (row 0 = zero: images and single frames get none)
    -> pre-LN blocks (MHA with 2-D RoPE, block-diagonal per chunk; GELU-tanh MLP) -> final LayerNorm
    -> mean over t, 2x2 merge -> [N, 4, W] -> projector -> [N, d_lm]

Shapes: ``P`` packed patches, ``n`` chunks (images are t = 1), ``N`` merged tokens, ``W`` width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from kernels.host_ints import remember
from vision_encoder.attention import AttentionLayout, MoonViTAttention, block_diagonal_mask, resolve_backend
from vision_encoder.config import MoonViTConfig
from vision_encoder.layer_norm import LayerNorm
from vision_encoder.merger import MoonViTProjector, temporal_merge
from vision_encoder.packed_tables import Grid, PackedTables, bicubic_matrix, grid_key, packed_tables
from vision_encoder.rope_2d import rope_cos_sin_colrow, rope_inv_freq


@dataclass
class MoonViTOutput:
    last_hidden_state: torch.Tensor  # [P, W] after the final norm
    merged: torch.Tensor  # [N, K, W] time-pooled 2x2 groups
    projected: torch.Tensor | None  # [N, d_lm] when the model has a projector


def sincos_time_table(num_frames: int, width: int) -> torch.Tensor:
    """``[num_frames + 1, W]``: row 0 zero, row f+1 = [sin(f * w_i), cos(f * w_i)], w_i = 1e4^(-2i/W)."""
    pos = torch.arange(num_frames, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, width, 2, dtype=torch.float32) / width))
    freqs = torch.outer(pos, inv)
    return torch.cat([torch.zeros(1, width), torch.cat([freqs.sin(), freqs.cos()], dim=1)])


class MoonViTPositionEmbedding(nn.Module):
    """Learned ``[Hp, Wp, W]`` table, bicubic-interpolated per chunk size, plus the fixed time table.

    The resize runs as matmuls with the bicubic weight matrices (``packed_tables.bicubic_matrix``), in fp32 even
    under autocast: the same function as ``F.interpolate`` on the table (tested), whose CUDA kernel took ~1.5 ms
    forward and ~0.65 ms backward per chunk size in the training app's H100 profile (session 6, call3). For a packed
    batch: one resample per distinct ``(h, w)`` (the rows ``A_h T`` once per distinct height), then the ``[P, W]``
    term is one gather over the concatenated resampled tables plus, when the batch holds video chunks, one gather
    of the time table: ops per distinct size, none per chunk (the indices come from
    :mod:`vision_encoder.packed_tables`), at sizes rounded up to ``packed_tables.SIZE_ALIGN`` so that the GEMMs
    take a few shapes (cuBLAS picks an algorithm per new shape: ``MoonViTConfig.row_bucket``)."""

    def __init__(self, cfg: MoonViTConfig) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.zeros(cfg.pos_emb_height, cfg.pos_emb_width, cfg.hidden_size))
        self.max_frames = cfg.pos_emb_time
        self.merge = cfg.merge_size
        self.register_buffer("time_table", sincos_time_table(cfg.pos_emb_time, cfg.hidden_size), persistent=False)

    def spatial(self, h: int, w: int) -> torch.Tensor:
        """``[h * w, W]`` table resampled to an ``h x w`` grid (identity at the table's own size)."""
        table = self.table
        hp, wp, width = table.shape
        if (h, w) == (hp, wp):
            return table.reshape(h * w, width)
        a_h, a_w = (bicubic_matrix(n_in, n_out).to(table.device, table.dtype) for n_in, n_out in ((hp, h), (wp, w)))
        with torch.autocast(table.device.type, enabled=False):
            rows = (a_h @ table.reshape(hp, wp * width)).view(h, wp, width)  # A_h T
            return (a_w @ rows).reshape(h * w, width)  # A_w (A_h T) per output row

    def resampled(self, tables: PackedTables) -> torch.Tensor:
        """``[sum over tables' distinct sizes of h8 * w8, W]``: the table resampled to each size at ``(h, w)``
        rounded up to ``packed_tables.SIZE_ALIGN`` (zero rows past ``h``, columns past ``w``: a few GEMM shapes
        for cuBLAS, see the packed_tables docstring), concatenated; ``tables.spatial_P`` picks the real rows. Each
        distinct height's rows ``A_h T`` are computed once. The values equal :meth:`spatial`'s to fp32 rounding
        (a GEMM's result may depend on its shape)."""
        table = self.table
        hp, wp, width = table.shape
        host = tables.host
        with torch.autocast(table.device.type, enabled=False):
            a_h, a_w = tables.resample_h.to(table.dtype), tables.resample_w.to(table.dtype)
            flat = table.reshape(hp, wp * width)
            rows = [(a @ flat).view(-1, wp, width) for a in a_h.split(host.height_rows)]
            cols = a_w.split(host.width_rows)
            parts = [(cols[wi] @ rows[hi]).view(-1, width) for hi, wi in host.size_pieces]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def forward(self, grid_thw: torch.Tensor, tables: PackedTables | None = None) -> torch.Tensor:
        """``[P, W]`` position term for the packed patches of ``grid_thw [n, 3]`` (``tables``: its packed tables,
        built here when not given)."""
        if tables is None:
            tables = packed_tables(grid_thw, self.merge, self.table.shape[:2], self.table.device)
        longest = max(t for t, _, _ in tables.grid)
        if longest > self.max_frames:
            raise ValueError(f"chunk with t={longest} frames exceeds pos_emb_time={self.max_frames}")
        pos = F.embedding(tables.spatial_P, self.resampled(tables))
        if tables.time_P is not None:
            pos = pos + F.embedding(tables.time_P, self.time_table).to(pos.dtype)
        return pos


class MoonViTBlock(nn.Module):
    """Pre-LN transformer block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, cfg: MoonViTConfig) -> None:
        super().__init__()
        self.norm1 = LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = MoonViTAttention(cfg.hidden_size, cfg.num_heads)
        self.norm2 = LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: AttentionLayout) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, layout)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


def validate_inputs(pixel_values: torch.Tensor, grid_thw: torch.Tensor, cfg: MoonViTConfig) -> Grid:
    """Check the shapes; returns ``grid_thw`` as Python ints (its one host read)."""
    p = cfg.patch_size
    if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != (cfg.in_channels, p, p):
        raise ValueError(f"pixel_values must be [P, {cfg.in_channels}, {p}, {p}], got {tuple(pixel_values.shape)}")
    if grid_thw.dim() != 2 or grid_thw.shape[-1] != 3 or grid_thw.shape[0] == 0:
        raise ValueError(f"grid_thw must be [n >= 1, 3], got {tuple(grid_thw.shape)}")
    grid = grid_key(grid_thw)
    total = sum(t * h * w for t, h, w in grid)
    if total != pixel_values.shape[0]:
        raise ValueError(f"grid_thw {[list(g) for g in grid]} implies {total} patches, pixel_values has "
                         f"{pixel_values.shape[0]}")
    return grid


class MoonViT(nn.Module):
    """The MoonViT(-3D) encoder, with the projector when ``cfg.out_hidden_size`` is set.

    Example::

        model = MoonViT(moonvit_config("debug", out_hidden_size=64))
        out = model(pixel_values, grid_thw)   # [P, 3, 14, 14], [n, 3] from MoonViTProcessor
        out.projected                         # [sum_i h_i * w_i / 4, 64]
    """

    def __init__(self, cfg: MoonViTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.patch_embed = nn.Conv2d(cfg.in_channels, cfg.hidden_size, cfg.patch_size, stride=cfg.patch_size)
        self.pos_emb = MoonViTPositionEmbedding(cfg)
        self.blocks = nn.ModuleList(MoonViTBlock(cfg) for _ in range(cfg.num_layers))
        self.norm = LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.register_buffer("rope_inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)
        self.projector = (MoonViTProjector(cfg.hidden_size, cfg.merge_size, cfg.out_hidden_size,
                                           cfg.projector_norm_eps) if cfg.out_hidden_size else None)
        self.gradient_checkpointing = False
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        std = self.config.initializer_range
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.trunc_normal_(self.pos_emb.table, std=std, a=-2 * std, b=2 * std)
        self.pos_emb.time_table.copy_(sincos_time_table(self.config.pos_emb_time, self.config.hidden_size))
        self.rope_inv_freq.copy_(rope_inv_freq(self.config.head_dim, self.config.rope_theta))

    def tables(self, grid: Grid, row_bucket: int = 0) -> PackedTables:
        """The packed batch's index tables on the model's device (one host-to-device copy)."""
        return packed_tables(grid, self.config.merge_size, tuple(self.pos_emb.table.shape[:2]),
                             self.pos_emb.table.device, row_bucket)

    def embed(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor,
              tables: PackedTables | None = None) -> torch.Tensor:
        """``[P, W]`` patch embeddings plus the spatial (and temporal) position term."""
        x = self.patch_embed(pixel_values.to(self.patch_embed.weight.dtype)).flatten(1)
        return x + self.pos_emb(grid_thw, tables).to(x.dtype)

    def _run_blocks(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: AttentionLayout):
        for block in self.blocks:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, cos, sin, layout, use_reentrant=False)
            else:
                x = block(x, cos, sin, layout)
        return x

    def _finish(self, hidden_PD: torch.Tensor, grid_thw: torch.Tensor, tables: PackedTables,
                row_bucket: int = 0) -> MoonViTOutput:
        """Final norm, merge and projector of the ``[P or padded P, W]`` trunk output (padding rows dropped)."""
        hidden_PD = self.norm(hidden_PD[: tables.total])
        merged = temporal_merge(hidden_PD, grid_thw, self.config.merge_size, tables)
        projected = None
        if self.projector is not None:
            projected = self.projector(merged, row_bucket // self.config.merge_size**2)
        return MoonViTOutput(hidden_PD, merged, projected)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor, backend: str | None = None) -> MoonViTOutput:
        """Packed forward: ``pixel_values [P, 3, 14, 14]``, ``grid_thw [n, 3]`` -> ``MoonViTOutput``."""
        cfg = self.config
        tables = self.tables(validate_inputs(pixel_values, grid_thw, cfg), cfg.row_bucket)
        x = self.embed(pixel_values, grid_thw, tables)
        cos, sin = rope_cos_sin_colrow(tables.colrow_P2, self.rope_inv_freq)
        layout = packed_layout(tables, x, backend or cfg.attention_backend, cfg.masked_attention_max_len)
        padded = layout.score_cu_seqlens is not None
        if padded:
            x, cos, sin = (pad_rows(t, tables.padded_total) for t in (x, cos, sin))
        return self._finish(self._run_blocks(x, cos, sin, layout), grid_thw, tables, cfg.row_bucket if padded else 0)

    def forward_padded(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> MoonViTOutput:
        """Same function, but every chunk is padded to the longest one (``[n, L, W]`` batch with a key
        mask) - the NaFlexViT-style baseline that the packed path is measured against."""
        tables = self.tables(validate_inputs(pixel_values, grid_thw, self.config))
        x = self.embed(pixel_values, grid_thw, tables)
        cos, sin = rope_cos_sin_colrow(tables.colrow_P2, self.rope_inv_freq)
        lengths = torch.tensor([t * h * w for t, h, w in tables.grid])
        keep_NL = (torch.arange(tables.max_seqlen)[None, :] < lengths[:, None]).to(x.device)
        layout = AttentionLayout(cu_seqlens=tables.cu_seqlens, max_seqlen=tables.max_seqlen, backend="padded",
                                 key_padding_mask_NL=keep_NL)
        pad = (lambda t: t.new_zeros(keep_NL.shape + t.shape[-1:]).masked_scatter(keep_NL[..., None], t))
        hidden = self._run_blocks(pad(x), pad(cos), pad(sin), layout)
        return self._finish(hidden[keep_NL], grid_thw, tables)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x [P, ...]`` with zero rows appended up to ``rows`` (``x`` itself when it has them already)."""
    return x if x.shape[0] == rows else F.pad(x, (0, 0) * (x.dim() - 1) + (0, rows - x.shape[0]))


@torch.compiler.disable  # host-side set-up (the host_ints cache), not traceable by dynamo
def packed_layout(tables: PackedTables, x: torch.Tensor, requested: str, masked_max_len: int) -> AttentionLayout:
    """``cu_seqlens`` over whole chunks (a video chunk attends across its frames) and the backend. With a
    padding segment (``tables.cu_seqlens_padded``) attention runs over it too, and the QK max pass over
    ``score_cu_seqlens`` (the real chunks only); the masked backend ignores the padding (its mask is
    ``[P, P]``)."""
    remember(tables.cu_seqlens, tables.cu_seqlens_host())  # later host reads (QK max pass) need no sync
    backend = resolve_backend(requested, x, tables.total, masked_max_len)
    mask = block_diagonal_mask(tables.segment_P) if backend == "masked" else None
    if tables.cu_seqlens_padded is None or backend not in ("varlen", "loop"):
        return AttentionLayout(cu_seqlens=tables.cu_seqlens, max_seqlen=tables.max_seqlen, backend=backend,
                               block_mask_PP=mask)
    cu_host = tables.cu_seqlens_padded_host()
    remember(tables.cu_seqlens_padded, cu_host)
    return AttentionLayout(cu_seqlens=tables.cu_seqlens_padded, max_seqlen=max(tables.max_seqlen,
                           cu_host[-1] - cu_host[-2]), backend=backend, score_cu_seqlens=tables.cu_seqlens)
