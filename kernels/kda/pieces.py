"""The KDA forward in pieces along time, so that the sequential state pass overlaps the parallel kernels.

With few (sequence, value head) pairs the state pass (``chunk_triton._state_kernel``) has a program for only some
of the SMs and walks hundreds of chunks one after another (at 1 x 32768 x 16: 128 programs, 512 chunks each), while
the scores and output kernels before and after it are fully parallel. Cut every sequence's chunks into ``P``
consecutive pieces: piece j's scores run on the current stream, its state pass on a high-priority side stream as
soon as they are done (starting from piece j - 1's final states), its output on a third stream after that, so the
state pass of piece j runs beside the scores of piece j + 1. The kernels and their arithmetic are the same (the
outputs are bit-equal); the scores and output kernels read their piece's chunk indices from a table (``HAS_CIDX``),
the state pass takes per-piece sequence tables. Dense batches only (``cu_seqlens`` None: every sequence has the same
chunks); under the interpreter (CPU) the pieces run one after another on one stream.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from kernels.backend import sm_count
from kernels.fast_launch import CompiledLaunch, fast_launch_enabled

# pieces of the forward: 1 off; an int > 1 that many (at most one a chunk); None by the shape (fwd_pieces). H100,
# session 39, training-path forward: call3 (sweep_kda_fwd) at 1x32768x16 (16 pairs): one piece 2.179 / 2.187 ms, 3 or
# 4 pieces 1.944, 5 / 6 / 8 pieces 2.32 / 2.55 / 2.90; call6 (bench_kda --graph, CUDA-graph forwards) at 1x8192x32 and
# 2x16384x16 (32 pairs each): 1 piece 0.999 / 1.921 ms, 2 pieces 0.976 / 1.848, 4 pieces 1.040 / 1.960
FWD_PIECES: int | None = None
PIECES_FEW = 2  # pieces the shape rule picks when the pieces' state pass has a program for most SMs ...
PIECES_MANY = 4  # ... and when it has one for at most PIECE_MANY_FILL of them
PIECE_MANY_FILL = 0.5
PIECE_MIN_CHUNKS = 64  # chunks of a sequence per piece, at least, for the shape rule
PIECE_FILL = 1.0  # the shape rule cuts only when the state pass has at most this many programs an SM
# value columns per program of the pieces' state passes (chunk_triton.STATE_BV, when set, wins). Call2 at 1x32768x16,
# 4 pieces: 2.010 ms at 32 columns, 2.084 at 16, 2.050 at 64; call3: 2 stages instead of 3 2.108 (32) / 2.105 (16)
PIECE_STATE_BV = 32
# relative sizes of the pieces, first to last, by piece count (a count not in it: near-equal pieces). Larger early
# pieces leave a shorter last state pass and output after the last scores, the part nothing overlaps. H100, session
# 42 call1 (sweep_kda_fwd --graph, one process a shape), 2 pieces against 2 equal ones: 3:2 / 2:1 / 3:1 / 4:1 took
# 0.994 / 0.980 / 0.979 / 0.975 of their time at 1x8192x32 and 0.984 / 0.975 / 0.961 / 0.948 at 2x16384x16
PIECE_WEIGHTS: dict[int, tuple[float, ...]] = {2: (4.0, 1.0)}


def fwd_pieces(chunks_per_seq: int | None, pairs: int, v: int, device: torch.device) -> int:
    """How many pieces the forward runs in, for sequences of ``chunks_per_seq`` chunks (None: varlen, one piece) and
    ``pairs`` (sequence, value head) pairs of ``v`` value columns: ``FWD_PIECES`` when an int (capped at the chunks
    of a sequence); with ``None``, on a GPU, when the pieces' state pass (``PIECE_STATE_BV`` columns a program) has
    at most ``PIECE_FILL`` programs an SM: ``PIECES_MANY`` if at most ``PIECE_MANY_FILL``, else ``PIECES_FEW``, and
    no more than one per ``PIECE_MIN_CHUNKS`` chunks of a sequence."""
    if chunks_per_seq is None or chunks_per_seq < 2:
        return 1
    if FWD_PIECES is not None:
        return max(1, min(FWD_PIECES, chunks_per_seq))
    programs = pairs * -(-max(v, 16) // PIECE_STATE_BV)
    sms = sm_count(device) if device.type == "cuda" else 0
    if programs > PIECE_FILL * sms:
        return 1
    want = PIECES_MANY if programs <= PIECE_MANY_FILL * sms else PIECES_FEW
    return max(1, min(want, chunks_per_seq // PIECE_MIN_CHUNKS))


class PieceTables(NamedTuple):
    """Per piece j: ``cidx[j]`` the chunk indices (int32, sequence-major, as the chunk table orders them),
    ``s0[j]``, ``nc[j]`` each sequence's first chunk and number of chunks in the piece ([B] int32)."""

    cidx: list[torch.Tensor]
    s0: list[torch.Tensor]
    nc: list[torch.Tensor]


def piece_tables(batch: int, chunks_per_seq: int, pieces: int, device: torch.device) -> PieceTables:
    """The tables of ``pieces`` pieces (:func:`piece_bounds`) of ``batch`` sequences of ``chunks_per_seq`` chunks
    each: made on the device once a shape and kept (never evicted: a CUDA graph captured after a warm-up call points
    at them), except inside a capture, where they are made afresh as part of the graph (a capture does not run its
    kernels, so tables made there hold nothing until the graph replays and must not serve eager calls)."""
    bounds = piece_bounds(chunks_per_seq, pieces, PIECE_WEIGHTS.get(pieces))
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _make_tables(batch, chunks_per_seq, bounds, device)
    return _kept_tables(batch, chunks_per_seq, bounds, device)


def piece_bounds(chunks: int, pieces: int, weights: tuple[float, ...] | None = None) -> tuple[int, ...]:
    """Chunk boundaries ``(0, ..., chunks)`` of ``pieces`` pieces, each at least one chunk (``chunks >= pieces``):
    near-equal (``j * chunks // pieces``) without ``weights``, else in proportion to them (positive, one a piece),
    each boundary rounded down."""
    if not 1 <= pieces <= chunks:
        raise ValueError(f"pieces.piece_bounds: {pieces} pieces for {chunks} chunks")
    if weights is None:
        return tuple(j * chunks // pieces for j in range(pieces + 1))
    if len(weights) != pieces or min(weights) <= 0:
        raise ValueError(f"pieces.piece_bounds: weights {weights} for {pieces} pieces (positive, one a piece)")
    total, acc, bounds = sum(weights), 0.0, [0]
    for j, w in enumerate(weights[:-1]):
        acc += w
        later = pieces - 1 - j  # pieces after this one, each keeping a chunk
        bounds.append(min(max(math.floor(chunks * acc / total + 1e-9), bounds[-1] + 1), chunks - later))
    return (*bounds, chunks)


def _make_tables(batch: int, chunks_per_seq: int, bounds: tuple[int, ...], device: torch.device) -> PieceTables:
    first = torch.arange(batch, device=device, dtype=torch.int32) * chunks_per_seq
    cidx, s0, nc = [], [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        cidx.append((first[:, None] + torch.arange(lo, hi, device=device, dtype=torch.int32)[None, :]).flatten())
        s0.append(first + lo)
        nc.append(torch.full((batch,), hi - lo, device=device, dtype=torch.int32))
    return PieceTables(cidx, s0, nc)


_kept_tables = functools.cache(_make_tables)


class Relaunch:
    """One kernel launched once a piece in one forward: ``relaunch(grid, varying, **args)``, ``varying`` the
    arguments that change between pieces (pointers to per-piece tables and states, 16-byte aligned as every fresh
    allocation is, and the flags that come with them), ``args`` those that do not. The first launch at a grid and set
    of flags goes through the JIT, the later ones call its compiled runner (``kernels.fast_launch.CompiledLaunch``;
    the JIT's own launch costs ~30 us of host time, session 12, and the pieces multiply the launches). Made afresh
    for each forward, so its key only needs what varies inside one: the grid and the varying flags."""

    def __init__(self, kernel, **options) -> None:
        self.kernel, self.options, self.launch = kernel, options, CompiledLaunch(kernel)

    def __call__(self, grid: tuple, varying: dict, **args) -> None:
        args = args | varying
        if not fast_launch_enabled():  # the interpreter (whose kernels have no signature list) or KVL_FAST_LAUNCH=0
            self.kernel[grid](**args, **self.options)
            return
        key = tuple(v for v in varying.values() if isinstance(v, bool | int))
        values = [args[p.name] if p.name in args else p.default for p in self.kernel.params]
        self.launch(grid, key, *values, **self.options)


@functools.cache
def _side_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
    """The state passes' stream (the highest priority, so its programs take SMs before the next piece's scores
    programs waiting for them) and the outputs' stream."""
    return torch.cuda.Stream(device, priority=-100), torch.cuda.Stream(device)


def run_pieces(pieces: int, device: torch.device, scores: Callable[[int], None], state: Callable[[int], None],
               output: Callable[[int], None]) -> None:
    """Launch piece j's ``scores(j)``, ``state(j)``, ``output(j)`` for every piece: on a GPU the scores on the current
    stream, the state passes in order on a side stream, each after its piece's scores, and each output after its
    state pass on a third stream, both joined back before returning (also inside a CUDA graph capture); off CUDA in
    order on one stream. Every tensor the launches use must be allocated before the call."""
    if device.type != "cuda":
        for j in range(pieces):
            scores(j)
            state(j)
            output(j)
        return
    main = torch.cuda.current_stream(device)
    side, outs = _side_streams(device)
    side.wait_stream(main)
    outs.wait_stream(main)
    for j in range(pieces):
        scores(j)
        side.wait_event(main.record_event())
        with torch.cuda.stream(side):
            state(j)
        outs.wait_event(side.record_event())
        with torch.cuda.stream(outs):
            output(j)
    main.wait_stream(side)
    main.wait_stream(outs)
