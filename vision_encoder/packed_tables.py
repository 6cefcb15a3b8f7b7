"""The integer tables of a packed MoonViT batch, built on the host and moved to the device in one copy.

Every index the encoder needs for a batch ``grid_thw`` (patch positions for RoPE, the position-embedding gather,
the attention segments, the temporal 2x2 merge) is a function of the chunk sizes alone. Built per chunk with device
ops they cost several small kernel launches per chunk, and an app batch has dozens of chunks. Here they are built
from the Python ints of ``grid_thw`` with a fixed number of vectorised NumPy ops (whatever the number of chunks;
NumPy, not torch CPU ops: on the GPU host, where data-loader processes and the pin-memory thread share the cores,
the same torch ops took ~50 ms a batch, session 7 call3), packed into one int32 buffer together with the fp32
bicubic resampling matrices of the position table (which travel as their bits and are viewed back as fp32; every
table starts 16-byte aligned), and moved with ONE pinned non-blocking copy: a pageable copy would synchronise the
host with the device. The host tables are cached by grid (``_SLOTS`` entries).

Device tables (:class:`PackedTables`), int32 unless stated:

- ``cu_seqlens [n + 1]`` chunk boundaries; ``segment_P [P]`` chunk id of each patch (the masked-attention mask);
  ``cu_seqlens_padded [n + 2]`` the same plus one padding segment up to the next multiple of ``row_bucket``
  (``None`` without a bucket or when ``P`` is a multiple already; see ``MoonViTConfig.row_bucket``);
- ``colrow_P2 [P, 2]`` (col, row) of each patch in its frame (the RoPE angle order, ``rope_2d``);
- ``spatial_P [P]`` row of each patch in the concatenation, over ``sizes`` (the distinct ``(h, w)`` in order of
  first appearance), of the position table resampled to each size, computed at ``(h8, w8)`` = ``(h, w)`` rounded
  up to multiples of ``SIZE_ALIGN`` (the rows past ``h`` and columns past ``w`` are zero and never gathered);
  ``time_P [P]`` row of the time table (frame + 1 in a video chunk, 0 = the zero row for ``t = 1``), ``None`` when
  every chunk has ``t = 1``;
- ``resample_h [sum of distinct h8, Hp]`` and ``resample_w [sum of distinct w8, Wp]`` fp32: the 1-D bicubic
  matrices of the distinct heights and widths, each with zero rows up to ``h8`` (``w8``), stacked (``height_rows``
  / ``width_rows`` give the split). The padding keeps the resampling matmuls to a few shapes: cuBLAS picks an
  algorithm per new shape (157 us of host time for an ``mm`` on an H100, 20-29 us for a known one: see
  ``MoonViTConfig.row_bucket``), and an app batch holds ~8 image sizes, half of them new at step 20 (session 8);
- ``merge_groups``: per distinct ``t``, ``(t, index [N_t * t * K])``: the packed indices of the ``t x K`` source
  patches of each merged token of the chunks with that ``t``; ``merge_order_N [N]``: where each token (in chunk
  order) sits in the concatenation of the groups, ``None`` when there is one group.

Shapes: ``P`` packed patches, ``n`` chunks, ``N`` merged tokens, ``K = merge**2``, ``Hp x Wp`` the learned table.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

Grid = tuple[tuple[int, int, int], ...]

_SLOTS = 32
SIZE_ALIGN = 8  # resampled position tables are computed at (h, w) rounded up to multiples of this
_ALIGN = 4  # int32 elements: 16 bytes


@functools.lru_cache(maxsize=256)
def _bicubic_f32(n_in: int, n_out: int) -> np.ndarray:
    """fp32 ``[n_out rounded up to SIZE_ALIGN, n_in]``: :func:`bicubic_matrix` with zero rows appended."""
    out = np.zeros((_aligned(n_out), n_in), dtype=np.float32)
    out[:n_out] = bicubic_matrix(n_in, n_out).float().numpy()
    return out


def _aligned(n: int) -> int:
    return -(-n // SIZE_ALIGN) * SIZE_ALIGN


def _aligned_np(n: np.ndarray) -> np.ndarray:
    return -(-n // SIZE_ALIGN) * SIZE_ALIGN


@functools.lru_cache(maxsize=256)
def bicubic_matrix(n_in: int, n_out: int) -> torch.Tensor:
    """fp64 ``[n_out, n_in]``: 1-D bicubic resampling exactly as ``F.interpolate(mode="bicubic",
    align_corners=False)`` weighs the inputs along one axis (read off by resampling the identity; the other axis
    stays at size 1, where bicubic is the identity). The 2-D resize is separable: ``A_h T A_w^T`` per channel."""
    eye = torch.eye(n_in, dtype=torch.float64)[None, :, :, None]  # [1, C = n_in, H = n_in, W = 1]
    return F.interpolate(eye, size=(n_out, 1), mode="bicubic", align_corners=False)[0, :, :, 0].T.contiguous()


def grid_key(grid_thw: torch.Tensor) -> Grid:
    """``grid_thw [n, 3]`` as a tuple of Python int triples (one host read; the cache key)."""
    return tuple((int(t), int(h), int(w)) for t, h, w in grid_thw.tolist())


@dataclass
class HostTables:
    """The cached host side: one int32 buffer, how to cut it, and the Python facts the model needs."""

    grid: Grid
    flat: torch.Tensor  # int32 [total]: every table back to back
    layout: list[tuple[str, tuple[int, ...], bool]]  # (name, shape, is fp32 bits) in buffer order
    sizes: list[tuple[int, int]]  # distinct (h, w), first appearance
    heights: list[int]  # distinct h
    widths: list[int]  # distinct w
    height_rows: list[int]  # rows of resample_h per distinct h (h rounded up to SIZE_ALIGN)
    width_rows: list[int]  # rows of resample_w per distinct w
    size_pieces: list[tuple[int, int]]  # per size: (index into heights, index into widths)
    merge_ts: list[int]  # distinct t of the merge groups, in group order
    has_video: bool
    row_bucket: int = 0


@dataclass
class PackedTables:
    """Device views of one :class:`HostTables` buffer (see the module docstring for each field)."""

    grid: Grid
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor | None
    segment_P: torch.Tensor
    colrow_P2: torch.Tensor
    spatial_P: torch.Tensor
    time_P: torch.Tensor | None
    resample_h: torch.Tensor | None
    resample_w: torch.Tensor | None
    merge_groups: list[tuple[int, torch.Tensor]]
    merge_order_N: torch.Tensor | None
    host: HostTables

    @property
    def total(self) -> int:
        return sum(t * h * w for t, h, w in self.grid)

    @property
    def max_seqlen(self) -> int:
        return max(t * h * w for t, h, w in self.grid)

    @property
    def padded_total(self) -> int:
        """Rows of the padded batch: :attr:`total` rounded up to a multiple of the tables' ``row_bucket``."""
        return padded_rows(self.total, self.host.row_bucket)

    def cu_seqlens_host(self) -> list[int]:
        out = [0]
        for t, h, w in self.grid:
            out.append(out[-1] + t * h * w)
        return out

    def cu_seqlens_padded_host(self) -> list[int]:
        """The host values of ``cu_seqlens_padded`` (``cu_seqlens_host()`` when there is no padding segment)."""
        out = self.cu_seqlens_host()
        return out if self.cu_seqlens_padded is None else out + [padded_rows(out[-1], self.host.row_bucket)]


def _patch_tables(t: np.ndarray, h: np.ndarray, w: np.ndarray, size_id: np.ndarray,
                  size_offset: np.ndarray) -> dict[str, np.ndarray]:
    """Per-patch tables (int64, host) from the per-chunk ``t, h, w [n]``."""
    n = t.size
    hw = h * w
    lengths = t * hw
    start = np.cumsum(lengths) - lengths
    chunk = np.repeat(np.arange(n), lengths)  # [P]
    local = np.arange(int(lengths.sum())) - start[chunk]
    in_frame = local % hw[chunk]
    row = in_frame // w[chunk]
    col = in_frame - row * w[chunk]
    return {"cu_seqlens": np.concatenate([[0], np.cumsum(lengths)]),
            "segment_P": chunk, "colrow_P2": np.stack([col, row], axis=-1),
            "spatial_P": size_offset[size_id[chunk]] + row * _aligned_np(w)[chunk] + col,
            "time_P": np.where(t[chunk] > 1, local // hw[chunk] + 1, 0)}


def _merge_tables(t: np.ndarray, h: np.ndarray, w: np.ndarray, merge: int) -> tuple[dict, list[int]]:
    """``merge_group_<i> [N_t, t, K]`` per distinct ``t`` and ``merge_order_N`` (when more than one group)."""
    lengths = t * h * w
    start = np.cumsum(lengths) - lengths
    per_row = w // merge
    tokens = (h // merge) * per_row
    chunk = np.repeat(np.arange(t.size), tokens)  # [N]
    j = np.arange(int(tokens.sum())) - (np.cumsum(tokens) - tokens)[chunk]
    block_row, block_col = j // per_row[chunk], j % per_row[chunk]
    wc = w[chunk]
    base = start[chunk] + block_row * merge * wc + block_col * merge  # top-left source patch of each token
    steps = np.arange(merge)
    k_offset = (steps[None, :, None] * wc[:, None, None] + steps[None, None, :]).reshape(-1, merge * merge)
    frame_size = (h * w)[chunk]
    tc = t[chunk]
    out, ts, members = {}, [], []
    for i, tv in enumerate(sorted(set(t.tolist()))):
        sel = np.flatnonzero(tc == tv)
        frames = np.arange(tv)[None, :, None] * frame_size[sel, None, None]
        out[f"merge_group_{i}"] = base[sel, None, None] + frames + k_offset[sel, None, :]
        ts.append(tv)
        members.append(sel)
    if len(members) > 1:
        order = np.empty(chunk.size, dtype=np.int64)
        order[np.concatenate(members)] = np.arange(chunk.size)
        out["merge_order_N"] = order
    return out, ts


def _check_grid(grid: Grid, merge: int) -> None:
    if not grid:
        raise ValueError("grid_thw must hold at least one chunk, got none")
    for t, h, w in grid:
        if min(t, h, w) < 1:
            raise ValueError(f"grid (t={t}, h={h}, w={w}) has an empty dimension")
        if h % merge or w % merge:
            raise ValueError(f"grid (t={t}, h={h}, w={w}) is not divisible by merge size {merge}")


def padded_rows(total: int, row_bucket: int) -> int:
    """``total`` rounded up to a multiple of ``row_bucket`` (``row_bucket <= 1``: ``total``)."""
    return total if row_bucket <= 1 else -(-total // row_bucket) * row_bucket


@functools.lru_cache(maxsize=_SLOTS)
def host_tables(grid: Grid, merge: int, table_hw: tuple[int, int] | None, row_bucket: int = 0) -> HostTables:
    """Build (and cache) the tables of ``grid`` for merge size ``merge`` and a learned table of ``table_hw``
    (``None``: no resampling matrices); with ``row_bucket > 1`` and a patch count ``P`` that is not a multiple of
    it, also ``cu_seqlens_padded [n + 2]``: the chunks plus one padding segment up to the next multiple."""
    _check_grid(grid, merge)
    sizes = list(dict.fromkeys((h, w) for _, h, w in grid))
    heights, widths = list(dict.fromkeys(h for h, _ in sizes)), list(dict.fromkeys(w for _, w in sizes))
    t, h, w = (np.array(col, dtype=np.int64) for col in zip(*grid))
    size_id = np.array([sizes.index((hh, ww)) for _, hh, ww in grid], dtype=np.int64)
    size_area = np.array([_aligned(hh) * _aligned(ww) for hh, ww in sizes], dtype=np.int64)
    tables = _patch_tables(t, h, w, size_id, np.cumsum(size_area) - size_area)
    has_video = bool((t > 1).any())
    if not has_video:
        del tables["time_P"]
    total = int(tables["cu_seqlens"][-1])
    if padded_rows(total, row_bucket) != total:
        tables["cu_seqlens_padded"] = np.append(tables["cu_seqlens"], padded_rows(total, row_bucket))
    merged, merge_ts = _merge_tables(t, h, w, merge)
    tables |= merged
    if table_hw is not None:
        hp, wp = table_hw
        tables["resample_h"] = np.concatenate([_bicubic_f32(hp, x) for x in heights])
        tables["resample_w"] = np.concatenate([_bicubic_f32(wp, x) for x in widths])
    layout, pieces = [], []
    for name, value in tables.items():
        is_float = value.dtype == np.float32
        layout.append((name, tuple(value.shape), is_float))
        piece = (value.view(np.int32) if is_float else value.astype(np.int32)).reshape(-1)
        pieces += [piece, np.zeros(_padded(piece.size) - piece.size, dtype=np.int32)]
    flat = torch.from_numpy(np.concatenate(pieces))
    return HostTables(grid=grid, flat=flat, layout=layout, sizes=sizes, heights=heights, widths=widths,
                      height_rows=[_aligned(x) for x in heights], width_rows=[_aligned(x) for x in widths],
                      size_pieces=[(heights.index(hh), widths.index(ww)) for hh, ww in sizes],
                      merge_ts=merge_ts, has_video=has_video, row_bucket=row_bucket)


def _to_device(host: HostTables, device: torch.device) -> torch.Tensor:
    """The flat buffer on ``device``: one pinned, non-blocking copy on CUDA. Pinned per call from the caching
    host allocator, which reuses a block once its copy has finished (a pinned buffer kept per cached grid
    cost a ``cudaHostAlloc``, ~1.5 ms, for every new grid: every step of the app)."""
    if device.type == "cpu":
        return host.flat
    if device.type == "cuda":
        return host.flat.pin_memory().to(device, non_blocking=True)
    return host.flat.to(device)


@torch.compiler.disable  # host-side set-up (lru cache, pinned copy), not traceable by dynamo
def packed_tables(grid_thw: torch.Tensor | Grid, merge: int, table_hw: tuple[int, int] | None,
                  device: torch.device | str, row_bucket: int = 0) -> PackedTables:
    """The device tables of a packed batch ``grid_thw [n, 3]`` (a tensor on any device, or a :data:`Grid`) for
    merge size ``merge`` and a learned position table of ``table_hw = (Hp, Wp)`` (``None``: no resampling
    matrices, for callers that only merge); ``row_bucket``: see :func:`host_tables`."""
    grid = grid_thw if isinstance(grid_thw, tuple) else grid_key(grid_thw)
    host = host_tables(grid, merge, None if table_hw is None else tuple(table_hw), max(row_bucket, 0))
    flat = _to_device(host, torch.device(device))
    sizes = []
    for _, shape, _ in host.layout:
        sizes += [_numel(shape), _padded(_numel(shape)) - _numel(shape)]
    views = {}
    for (name, shape, is_float), piece in zip(host.layout, flat.split(sizes)[::2]):  # [table, padding] pairs
        views[name] = (piece.view(torch.float32) if is_float else piece).view(shape)
    return PackedTables(
        grid=grid, cu_seqlens=views["cu_seqlens"], cu_seqlens_padded=views.get("cu_seqlens_padded"),
        segment_P=views["segment_P"], colrow_P2=views["colrow_P2"],
        spatial_P=views["spatial_P"], time_P=views.get("time_P"), resample_h=views.get("resample_h"),
        resample_w=views.get("resample_w"),
        merge_groups=[(tv, views[f"merge_group_{i}"].view(-1)) for i, tv in enumerate(host.merge_ts)],
        merge_order_N=views.get("merge_order_N"), host=host)


def _padded(numel: int) -> int:
    """Each table starts on a 16-byte boundary of the buffer (vectorised kernels and cuBLAS prefer it)."""
    return -(-numel // _ALIGN) * _ALIGN


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
