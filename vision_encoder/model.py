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

import functools
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from kernels.host_ints import remember
from vision_encoder.attention import AttentionLayout, MoonViTAttention, block_diagonal_mask, resolve_backend
from vision_encoder.config import MoonViTConfig
from vision_encoder.merger import MoonViTProjector, temporal_merge
from vision_encoder.rope_2d import patch_positions, rope_cos_sin, rope_inv_freq


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


@functools.lru_cache(maxsize=256)
def bicubic_matrix(n_in: int, n_out: int) -> torch.Tensor:
    """fp64 ``[n_out, n_in]``: 1-D bicubic resampling exactly as ``F.interpolate(mode="bicubic",
    align_corners=False)`` weighs the inputs along one axis (read off by resampling the identity; the other axis
    stays at size 1, where bicubic is the identity). The 2-D resize is separable: ``A_h T A_w^T`` per channel."""
    eye = torch.eye(n_in, dtype=torch.float64)[None, :, :, None]  # [1, C = n_in, H = n_in, W = 1]
    return F.interpolate(eye, size=(n_out, 1), mode="bicubic", align_corners=False)[0, :, :, 0].T.contiguous()


class MoonViTPositionEmbedding(nn.Module):
    """Learned ``[Hp, Wp, W]`` table, bicubic-interpolated per chunk, plus the fixed time table.

    The resize runs as two matmuls with the bicubic weight matrices (:func:`bicubic_matrix`), in fp32 even under
    autocast: the same function as ``F.interpolate`` on the table (tested), whose CUDA kernel took ~1.5 ms forward
    and ~0.65 ms backward per chunk size in the training app's H100 profile (session 6, call3)."""

    def __init__(self, cfg: MoonViTConfig) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.zeros(cfg.pos_emb_height, cfg.pos_emb_width, cfg.hidden_size))
        self.max_frames = cfg.pos_emb_time
        self.register_buffer("time_table", sincos_time_table(cfg.pos_emb_time, cfg.hidden_size), persistent=False)
        self._matrices: dict[tuple, torch.Tensor] = {}

    def _matrix(self, n_in: int, n_out: int) -> torch.Tensor:
        key = (n_in, n_out, self.table.device, self.table.dtype)
        if key not in self._matrices:
            self._matrices[key] = bicubic_matrix(n_in, n_out).to(self.table.device, self.table.dtype)
        return self._matrices[key]

    def spatial(self, h: int, w: int) -> torch.Tensor:
        """``[h * w, W]`` table resampled to an ``h x w`` grid (identity at the table's own size)."""
        table = self.table
        hp, wp, width = table.shape
        if (h, w) != (hp, wp):
            with torch.autocast(table.device.type, enabled=False):
                rows = (self._matrix(hp, h) @ table.reshape(hp, wp * width)).view(h, wp, width)  # A_h T
                table = self._matrix(wp, w) @ rows  # A_w (A_h T) per output row: [h, w, W]
        return table.reshape(h * w, -1)

    def forward(self, grid_thw: torch.Tensor) -> torch.Tensor:
        """``[P, W]`` position term for the packed patches of ``grid_thw [n, 3]``."""
        cache: dict[tuple[int, int], torch.Tensor] = {}
        parts = []
        for t, h, w in grid_thw.tolist():
            if t > self.max_frames:
                raise ValueError(f"chunk with t={t} frames exceeds pos_emb_time={self.max_frames}")
            if (h, w) not in cache:
                cache[(h, w)] = self.spatial(h, w)
            pos = cache[(h, w)]
            if t > 1:
                pos = pos[None] + self.time_table[1:t + 1, None, :].to(pos.dtype)
            parts.append(pos.reshape(t * h * w, -1))
        return torch.cat(parts)


class MoonViTBlock(nn.Module):
    """Pre-LN transformer block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, cfg: MoonViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = MoonViTAttention(cfg.hidden_size, cfg.num_heads)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: AttentionLayout) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, layout)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


def validate_inputs(pixel_values: torch.Tensor, grid_thw: torch.Tensor, cfg: MoonViTConfig) -> None:
    p = cfg.patch_size
    if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != (cfg.in_channels, p, p):
        raise ValueError(f"pixel_values must be [P, {cfg.in_channels}, {p}, {p}], got {tuple(pixel_values.shape)}")
    if grid_thw.dim() != 2 or grid_thw.shape[-1] != 3 or grid_thw.shape[0] == 0:
        raise ValueError(f"grid_thw must be [n >= 1, 3], got {tuple(grid_thw.shape)}")
    total = int(grid_thw.prod(-1).sum())
    if total != pixel_values.shape[0]:
        raise ValueError(f"grid_thw {grid_thw.tolist()} implies {total} patches, pixel_values has "
                         f"{pixel_values.shape[0]}")


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
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
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

    def embed(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """``[P, W]`` patch embeddings plus the spatial (and temporal) position term."""
        x = self.patch_embed(pixel_values.to(self.patch_embed.weight.dtype)).flatten(1)
        return x + self.pos_emb(grid_thw).to(x.dtype)

    def _run_blocks(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: AttentionLayout):
        for block in self.blocks:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, cos, sin, layout, use_reentrant=False)
            else:
                x = block(x, cos, sin, layout)
        return x

    def _finish(self, hidden_PD: torch.Tensor, grid_thw: torch.Tensor) -> MoonViTOutput:
        hidden_PD = self.norm(hidden_PD)
        merged = temporal_merge(hidden_PD, grid_thw, self.config.merge_size)
        projected = self.projector(merged) if self.projector is not None else None
        return MoonViTOutput(hidden_PD, merged, projected)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor, backend: str | None = None) -> MoonViTOutput:
        """Packed forward: ``pixel_values [P, 3, 14, 14]``, ``grid_thw [n, 3]`` -> ``MoonViTOutput``."""
        cfg = self.config
        validate_inputs(pixel_values, grid_thw, cfg)
        grid_thw = grid_thw.to("cpu", torch.long)
        x = self.embed(pixel_values, grid_thw)
        cos, sin = rope_cos_sin(patch_positions(grid_thw, x.device), self.rope_inv_freq)
        layout = packed_layout(grid_thw, x, backend or cfg.attention_backend, cfg.masked_attention_max_len)
        return self._finish(self._run_blocks(x, cos, sin, layout), grid_thw)

    def forward_padded(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> MoonViTOutput:
        """Same function, but every chunk is padded to the longest one (``[n, L, W]`` batch with a key
        mask) - the NaFlexViT-style baseline that the packed path is measured against."""
        validate_inputs(pixel_values, grid_thw, self.config)
        grid_thw = grid_thw.to("cpu", torch.long)
        x = self.embed(pixel_values, grid_thw)
        cos, sin = rope_cos_sin(patch_positions(grid_thw, x.device), self.rope_inv_freq)
        lengths = grid_thw.prod(-1)
        keep_NL = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]
        keep_NL = keep_NL.to(x.device)
        cu = F.pad(lengths.cumsum(0), (1, 0)).to(device=x.device, dtype=torch.int32)
        layout = AttentionLayout(cu_seqlens=cu, max_seqlen=int(lengths.max()), backend="padded",
                                 key_padding_mask_NL=keep_NL)
        pad = (lambda t: t.new_zeros(keep_NL.shape + t.shape[-1:]).masked_scatter(keep_NL[..., None], t))
        hidden = self._run_blocks(pad(x), pad(cos), pad(sin), layout)
        return self._finish(hidden[keep_NL], grid_thw)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


@torch.compiler.disable  # host-side set-up (a pinned copy and the host_ints cache), not traceable by dynamo
def packed_layout(grid_thw: torch.Tensor, x: torch.Tensor, requested: str, masked_max_len: int) -> AttentionLayout:
    """``cu_seqlens`` over whole chunks (a video chunk attends across its frames) and the backend."""
    lengths = grid_thw.prod(-1)
    cu_host = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    cu = cu_host.pin_memory().to(x.device, non_blocking=True) if x.is_cuda else cu_host  # pageable would sync
    remember(cu, cu_host.tolist())  # later host reads of these bounds (QK max pass) need no synchronisation
    total = int(lengths.sum())
    backend = resolve_backend(requested, x, total, masked_max_len)
    mask = block_diagonal_mask(cu, total) if backend == "masked" else None
    return AttentionLayout(cu_seqlens=cu, max_seqlen=int(lengths.max()), backend=backend, block_mask_PP=mask)
