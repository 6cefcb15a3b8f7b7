"""Attention Residuals: softmax mixing over depth instead of PreNorm's plain sum (``../shared/REFERENCE.md`` s. 3).

Sources ``v_0 = embedding``, ``v_i = f_i(...)`` (raw sublayer outputs). Sublayer ``l`` reads

    h_l = sum_i alpha_i v_i,   alpha = softmax_i( w_l . RMSNorm_l(v_i) )      (fp32, no temperature)

with ``w_l`` a zero-initialised pseudo-query ``[D]`` and ``RMSNorm_l`` a key norm with a learnable gain; a
separate query/norm mixes the sources for the final norm. Since ``w . (g * n) = (w * g) . n`` we work with
``u = w * g`` and the unit-RMS keys ``n_i = v_i * rstd_i``.

Block AttnRes groups the sublayers into blocks of ``S``: sources are ``[b_0 = embedding, completed block sums,
the current block's partial sum]`` (a block's first sublayer sees only completed blocks); full AttnRes is S = 1.

Implementations (all equal): ``mix_naive`` (stack + softmax, the reference); ``mix`` (training:
``kernels/attn_res``, a fused Triton kernel on CUDA that reads the sources in place, the ``AttnResMix`` custom
autograd function on CPU; both save only fp32 ``rstd`` and ``alpha`` ``[N, B, T]`` per call and recompute keys
in backward, so memory does not grow by a stacked copy of the sources per sublayer; the block states' gradients
are accumulated in place by the kernels, see ``GradSink``, and so is each running sum's into the next one's, see
:func:`chain_grads_enabled`); ``phase1``/``phase2``
(inference: one batched pass of a block's queries over the completed blocks, then an online-softmax merge of
each sublayer's own partial sum). Without autograd on CUDA the two-phase stream keeps the block states in one
contiguous buffer and runs ``kernels/attn_res/two_phase_triton.py`` (one launch per sublayer, which also adds
the previous output into its block: decode is launch-bound); ``KVL_ATTNRES_TWO_PHASE`` (``torch`` | ``triton``)
forces either form. The stream classes here are the single place that wires residuals; they also apply each
sublayer's input norm (``input(i, norm)``; the two-phase decode stream then hands ``h`` in a reused buffer).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from kernels.attn_res import AttnResMix, attn_res_mix, attn_res_mix_naive, attn_res_mix_norm
from kernels.attn_res import resolve_backend as resolve_mix_backend
from kernels.norm import add_rms_norm
from kernels.norm import resolve_backend as resolve_norm_backend
from kimi_vl.modeling.norm import RMSNorm

__all__ = ["AttnResMix", "AttnResStream", "BufferedTwoPhase", "ModuleResQuery", "ResProj", "ResQuery",
           "StandardStream", "alpha_stats", "chain_grads_enabled", "defer_grads_enabled", "fused_norm_enabled",
           "grad_sinks_enabled", "mix", "mix_naive", "mix_norm_enabled", "mix_with_norm", "phase1", "phase2",
           "stacked_u", "two_phase_backend"]

_TWO_PHASE = ("torch", "triton")


class ResProj(nn.Linear):
    """A pseudo-query ``w [1, D]`` stored as a bias-free ``Linear(D, 1)`` (zero-initialised by the model)."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim, 1, bias=False)


@dataclass
class ResQuery:
    """One sublayer's mixing parameters: pseudo-query ``w [D]``, key-norm gain ``g [D]``, eps."""

    weight: torch.Tensor
    gain: torch.Tensor
    eps: float

    def u(self) -> torch.Tensor:
        return self.weight.float().reshape(-1) * self.gain.float()


class ModuleResQuery(ResQuery):
    """A :class:`ResQuery` that reads ``weight``/``gain``/``eps`` from its modules each time it is used.

    FSDP2 swaps a layer's parameters for their unsharded tensors only inside that layer's forward; a query
    captured before the layer runs would still point at the sharded storage (an illegal memory access in the
    fused kernel, seen on 2 H200s). The stream therefore holds modules, not tensors. The modules themselves are
    never called, so they must belong to the FSDP unit whose forward is running (a unit of their own is gathered
    only in its modules' forward): a parameter still sharded (a ``DTensor``) when read is a clear error.
    """

    def __init__(self, proj: nn.Module, norm: nn.Module) -> None:  # noqa: D107 - no dataclass fields to set
        self._proj, self._norm = proj, norm

    weight = property(lambda self: _unsharded(self._proj, "weight"))  # type: ignore[assignment]
    gain = property(lambda self: _unsharded(self._norm, "key-norm gain"))  # type: ignore[assignment]
    eps = property(lambda self: self._norm.eps)  # type: ignore[assignment]


def queries_sharded(queries: Sequence[ResQuery]) -> bool:
    """Whether any module-backed query's parameters are FSDP2 shards right now (its layer not gathered yet)."""
    return any(isinstance(q, ModuleResQuery) and _is_dtensor(q._proj.weight) for q in queries)


def _unsharded(module: nn.Module, what: str) -> torch.Tensor:
    p = module.weight
    if _is_dtensor(p):
        raise RuntimeError(
            f"kimi_vl/modeling/attn_res.py: an AttnRes query's {what} ({type(module).__name__} "
            f"{tuple(p.shape)}) is still a sharded DTensor when the stream reads it: its module is in an FSDP "
            "unit that is not gathered at this point (FSDP2 gathers a unit only in its modules' forward and "
            "these modules are never called); keep it in the unit of the layer (or model) that uses it")
    return p


def _is_dtensor(t: torch.Tensor) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _rstd(v_fp32: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(v_fp32.pow(2).mean(-1) + eps)


def mix_naive(sources: Sequence[torch.Tensor], query: ResQuery) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: ``(h [B, T, D] in the sources' dtype, alpha [N, B, T] fp32)`` (stacks the sources)."""
    return attn_res_mix_naive(sources, query.weight, query.gain, query.eps)


def mix(sources: Sequence[torch.Tensor], query: ResQuery, backend: str | None = None, sinks: Sequence | None = None,
        u: torch.Tensor | None = None, defer: tuple | None = None, chain: bool = False) -> tuple:
    """The training path (same values as :func:`mix_naive`): the fused Triton kernel on CUDA, the
    :class:`AttnResMix` autograd function on CPU; ``backend`` or ``KVL_ATTNRES_BACKEND`` (``triton`` | ``torch``)
    forces one; ``sinks``: in-place gradient accumulation of shared sources; ``u``: the query's ``w * gain``
    precomputed; ``defer``: the block's deferred source gradients; ``chain``: also the last source passed through,
    or ``None`` (``kernels.attn_res.attn_res_mix``)."""
    return attn_res_mix(sources, query.weight, query.gain, query.eps, backend, sinks, u, defer, chain)


def mix_with_norm(sources: Sequence[torch.Tensor], query: ResQuery, norm: RMSNorm, sinks: Sequence | None = None,
                  u: torch.Tensor | None = None, defer: tuple | None = None, chain: bool = False) -> tuple:
    """``norm(h)`` for :func:`mix`'s ``h`` (same arguments and results otherwise), the mix and the norm in one Triton
    kernel each way where ``kernels.attn_res.attn_res_mix_norm`` can (see :func:`mix_norm_enabled`)."""
    return attn_res_mix_norm(sources, query.weight, query.gain, query.eps, norm.weight, norm.eps, None, sinks, u,
                             defer, chain)


def _normed(h: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
    return h if norm is None else norm(h)


def grad_sinks_enabled() -> bool:
    """``KVL_ATTNRES_GRAD_SINK`` (``1`` default | ``0``): whether the training stream accumulates the gradients
    of the completed block states in place (``kernels/attn_res/sinks.GradSink``)."""
    flag = os.environ.get("KVL_ATTNRES_GRAD_SINK") or "1"
    if flag not in ("0", "1"):
        raise ValueError(f"kimi_vl/modeling/attn_res.py: KVL_ATTNRES_GRAD_SINK must be 0 or 1, got {flag!r}")
    return flag == "1"


def chain_grads_enabled() -> bool:
    """``KVL_ATTNRES_CHAIN_GRAD`` (``1`` default | ``0``): whether the training stream builds each running sum from
    the previous one as passed through the mix that read it (``kernels.attn_res.attn_res_mix(chain=True)``), so that
    the mix's backward kernel adds the running sum's gradient into the next sum's in place instead of autograd adding
    the two (one add kernel of three passes a sublayer after a block's first)."""
    flag = os.environ.get("KVL_ATTNRES_CHAIN_GRAD") or "1"
    if flag not in ("0", "1"):
        raise ValueError(f"kimi_vl/modeling/attn_res.py: KVL_ATTNRES_CHAIN_GRAD must be 0 or 1, got {flag!r}")
    return flag == "1"


def defer_grads_enabled() -> bool:
    """``KVL_ATTNRES_DEFER_GRAD`` (``1`` default | ``0``): whether the training stream, with gradient sinks, forms
    the completed block states' gradients once per block instead of once per mix
    (``kernels/attn_res/mix_autograd.DeferredBlock``). Session 12 (H100, small flavor, 8 x 4096): the backward mix
    kernels 5.71 -> 3.14 ms a step plus 1.27 ms of flushes; the app at batch 16 ran at 0.977 / 0.987 of the
    per-mix step time (two interleaved rounds)."""
    flag = os.environ.get("KVL_ATTNRES_DEFER_GRAD") or "1"
    if flag not in ("0", "1"):
        raise ValueError(f"kimi_vl/modeling/attn_res.py: KVL_ATTNRES_DEFER_GRAD must be 0 or 1, got {flag!r}")
    return flag == "1"


def fused_norm_enabled() -> bool:
    """``KVL_FUSED_NORM`` (``1`` default | ``0``): whether each sublayer's input RMSNorm runs in the kernel that
    updates the residual stream instead of a launch of its own. The standard residual's add and norm are one kernel
    (``kernels.norm.add_rms_norm``) in inference and, on the Triton norm backend, in training, where the backward
    also adds the stream's gradient inside the norm's backward kernel (no separate add either way); block AttnRes's
    norm runs inside its two-phase kernels (inference) and, with :func:`mix_norm_enabled`, inside its training mixes.
    Equal to the separate Triton norm bit for bit in the interpreter's inference (``tests/model/test_attn_res.py``);
    training within rounding."""
    flag = os.environ.get("KVL_FUSED_NORM") or "1"
    if flag not in ("0", "1"):
        raise ValueError(f"kimi_vl/modeling/attn_res.py: KVL_FUSED_NORM must be 0 or 1, got {flag!r}")
    return flag == "1"


def mix_norm_enabled() -> bool:
    """``KVL_ATTNRES_MIX_NORM`` (``1`` default | ``0``), with :func:`fused_norm_enabled`: whether the training stream's
    mixes apply their sublayer's input RMSNorm in the mix's kernels (``kernels/attn_res/mix_norm_triton.py``: ``h``
    never stored, the norm's launches and passes gone; mixes of up to ``MAX_SOURCES`` sources)."""
    flag = os.environ.get("KVL_ATTNRES_MIX_NORM") or "1"
    if flag not in ("0", "1"):
        raise ValueError(f"kimi_vl/modeling/attn_res.py: KVL_ATTNRES_MIX_NORM must be 0 or 1, got {flag!r}")
    return flag == "1" and fused_norm_enabled()


def stacked_u(queries: Sequence[ResQuery]) -> torch.Tensor:
    """``u = w * gain`` of every query as one contiguous fp32 ``[Q, D]`` (a few ops, not a few per query). Session
    15 tried one stack of all weights and gains (3 kernels instead of 5): it needs a view per query, 18 more host
    operators a decode token in ``tests/model/test_decode_ops.py``'s count, for ~2 launches (~3 us) a graph-replayed
    token; kept as it was."""
    w = torch.stack([q.weight for q in queries]).reshape(len(queries), -1).float()
    return (w * torch.stack([q.gain for q in queries]).float()).contiguous()


_QUERY_TABLES: dict[tuple, object] = {}  # parameter addresses -> kernels.attn_res.two_phase_triton.QueryTable
_QUERY_TABLES_MAX = 8


def query_table(queries: Sequence[ResQuery]):
    """The two-phase kernels' :class:`~kernels.attn_res.two_phase_triton.QueryTable` of ``queries`` (their ``w`` and
    gain addresses), kept per set of addresses: a decode step reads the parameters' addresses, not their values,
    and launches nothing for its queries. Falls back to a table over ``stacked_u`` (computed now) when a parameter
    is not contiguous or the kinds mix dtypes."""
    from kernels.attn_res.two_phase_triton import QueryTable

    weights, gains = [q.weight for q in queries], [q.gain for q in queries]
    key = tuple((t.data_ptr(), t.dtype, t.numel()) for t in weights + gains)
    table = _QUERY_TABLES.get(key)
    if table is None:
        try:
            table = QueryTable(weights, gains)
        except ValueError:
            return QueryTable.from_u(stacked_u(queries))
        if len(_QUERY_TABLES) >= _QUERY_TABLES_MAX:
            del _QUERY_TABLES[next(iter(_QUERY_TABLES))]
        _QUERY_TABLES[key] = table
    return table


def two_phase_backend(x: torch.Tensor) -> str:
    """The two-phase form for a stream on ``x``: ``KVL_ATTNRES_TWO_PHASE`` if set, else ``triton`` on CUDA
    without autograd (fp32/fp16/bf16) and ``torch`` otherwise. The Triton kernels have no backward, so with
    autograd enabled the PyTorch form is used whatever is asked; ``triton`` on a CPU needs ``TRITON_INTERPRET=1``."""
    forced = os.environ.get("KVL_ATTNRES_TWO_PHASE") or None
    if forced is not None and forced not in _TWO_PHASE:
        raise ValueError(f"kimi_vl/modeling/attn_res.py: KVL_ATTNRES_TWO_PHASE must be one of {_TWO_PHASE}, "
                         f"got {forced!r}")
    if torch.is_grad_enabled() or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return "torch"
    if forced is None:
        return "triton" if x.is_cuda else "torch"
    if forced == "triton" and not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("kimi_vl/modeling/attn_res.py: KVL_ATTNRES_TWO_PHASE=triton on a CPU tensor needs "
                         "TRITON_INTERPRET=1")
    return forced


def phase1(completed: Sequence[torch.Tensor], queries: Sequence[ResQuery]):
    """All of a block's queries against its completed sources at once.

    Returns fp32 ``o [S, B, T, D]`` (unnormalised), ``m [S, B, T]`` (max score), ``l [S, B, T]`` (sum of exp).
    """
    v_NBTD = torch.stack([s.float() for s in completed])
    rstd = _rstd(v_NBTD, queries[0].eps)
    u_SD = torch.stack([q.u() for q in queries])
    scores = torch.einsum("nbtd,sd->snbt", v_NBTD, u_SD) * rstd
    m = scores.amax(dim=1)
    p = torch.exp(scores - m[:, None])
    return torch.einsum("snbt,nbtd->sbtd", p, v_NBTD), m, p.sum(dim=1)


def phase2(o: torch.Tensor, m: torch.Tensor, l: torch.Tensor, partial: torch.Tensor | None,
           query: ResQuery) -> torch.Tensor:
    """Online-softmax merge of one sublayer's phase-1 result with its own partial sum -> ``h [B, T, D]`` fp32."""
    if partial is None:
        return o / l[..., None]
    pf = partial.float()
    s = (pf @ query.u()) * _rstd(pf, query.eps)
    m_new = torch.maximum(m, s)
    a, b = torch.exp(m - m_new), torch.exp(s - m_new)
    return (o * a[..., None] + pf * b[..., None]) / (l * a + b)[..., None]


def alpha_stats(alpha_NBT: torch.Tensor, token_mask: torch.Tensor | None = None) -> dict[str, float]:
    """Mean over tokens of the entropy and max weight of alpha, and the weight on the embedding (source 0)."""
    a = alpha_NBT.detach().float().flatten(1)
    if token_mask is not None:
        a = a[:, token_mask.reshape(-1).bool()]
    entropy = -(a * a.clamp_min(1e-30).log()).sum(0)
    return {"entropy": float(entropy.mean()), "max_weight": float(a.max(0).values.mean()),
            "embed_weight": float(a[0].mean()), "num_sources": int(a.shape[0])}


def rms(x: torch.Tensor) -> float:
    return float(x.detach().float().pow(2).mean().sqrt())


class StandardStream:
    """PreNorm residual: ``x <- x + f(norm(x))``.

    On the Triton norm backend (CUDA) and with :func:`fused_norm_enabled`, a sublayer's output is held back and
    added by the next input's RMSNorm kernel (``kernels.norm.add_rms_norm``: the add and the norm in one launch,
    and in training one backward launch for the norm's gradient plus the stream's), as the block AttnRes stream's
    phase kernels apply the norm. Not while recording statistics (``record``)."""

    def __init__(self, embeddings: torch.Tensor, record: dict | None = None) -> None:
        self.x, self.record = embeddings, record
        self._pending: torch.Tensor | None = None
        self._fuse = (record is None and fused_norm_enabled()
                      and resolve_norm_backend(None, embeddings.device, "StandardStream") == "triton")

    def input(self, i: int, norm: nn.Module | None = None) -> torch.Tensor:
        """Sublayer ``i``'s input, through its input ``norm`` when given."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            if isinstance(norm, RMSNorm) and pending.dtype == self.x.dtype and not _is_dtensor(norm.weight):
                self.x, h = add_rms_norm(self.x, pending, norm.weight, norm.eps)
                return h
            self.x = self.x + pending
        return self.x if norm is None else norm(self.x)

    def add(self, i: int, out: torch.Tensor) -> None:
        if self._fuse:
            if self._pending is not None:  # two adds without an input between them
                self.x = self.x + self._pending
            self._pending = out
            return
        self.x = self.x + out
        if self.record is not None:
            self.record.setdefault("sublayer_output_rms", []).append(rms(out))
            self.record.setdefault("stream_rms", []).append(rms(self.x))

    def final(self, norm: nn.Module | None = None) -> torch.Tensor:
        return self.input(-1, norm)


class AttnResStream:
    """Block AttnRes (``block_size = 1`` is full AttnRes). ``queries`` has one entry per sublayer plus the output.

    ``impl``: ``"fused"`` (custom autograd; with autograd on, each completed block state gets a gradient sink so
    the Triton backward kernels accumulate its gradient in place, ``KVL_ATTNRES_GRAD_SINK=0`` turns that off),
    ``"naive"`` (stacked reference), ``"two_phase"`` (inference: :class:`BufferedTwoPhase` when
    :func:`two_phase_backend` says ``triton``, else :func:`phase1` / :func:`phase2`).
    """

    def __init__(self, embeddings: torch.Tensor, queries: Sequence[ResQuery], block_size: int, impl: str,
                 record: dict | None = None, token_mask: torch.Tensor | None = None) -> None:
        if impl not in ("fused", "naive", "two_phase"):
            raise ValueError(f"AttnResStream: impl must be fused, naive or two_phase, got {impl!r}")
        self.completed: list[torch.Tensor] = [embeddings]
        self.partial: torch.Tensor | None = None
        self.queries, self.block_size, self.impl = list(queries), block_size, impl
        self.record, self.token_mask = record, token_mask
        self._phase1: tuple | None = None
        self._buffered = BufferedTwoPhase(embeddings, self.queries, block_size) \
            if impl == "two_phase" and record is None and two_phase_backend(embeddings) == "triton" else None
        self._fused_norm = self._buffered is not None and fused_norm_enabled()  # read once a forward, not a sublayer
        self.sinks: list | None = None  # one GradSink per completed state (fused training path)
        self._u_rows: tuple[torch.Tensor, ...] | None = None  # every query's w * gain, one product per forward
        # (empty under FSDP2, where only the running layer's queries are gathered)
        self._deferred: dict | None = None  # block index -> DeferredBlock (KVL_ATTNRES_DEFER_GRAD, on by default)
        self._chain = impl == "fused" and torch.is_grad_enabled() and chain_grads_enabled()
        self._mix_norm = impl == "fused" and mix_norm_enabled()
        if impl == "fused" and torch.is_grad_enabled() and grad_sinks_enabled():
            from kernels.attn_res.mix_triton import MAX_ARGS, GradSink

            self._sink_cls = GradSink
            self.sinks = [GradSink()]
            if defer_grads_enabled() and 1 < block_size <= MAX_ARGS:  # a block of one mix has nothing to share
                self._deferred = {}

    def input(self, i: int, norm: nn.Module | None = None) -> torch.Tensor:
        """Sublayer ``i``'s input ``h``, through its input ``norm`` (an ``RMSNorm``) when given."""
        if self._buffered is not None:  # with a norm, h goes straight into it: a reused buffer will do
            if norm is not None and self._fused_norm and isinstance(norm, RMSNorm):
                return self._buffered.input(i, scratch=True, norm=(norm.weight, norm.eps))
            return _normed(self._buffered.input(i, scratch=norm is not None), norm)
        if self.impl == "two_phase":
            return _normed(self._two_phase_input(i), norm)
        sources = self.completed + ([self.partial] if self.partial is not None else [])
        if len(sources) == 1 and self.impl == "fused" and self.record is None:
            return _normed(sources[0], norm)
        if self.impl == "naive":
            h, alpha = mix_naive(sources, self.queries[i])
        else:
            sinks = None if self.sinks is None else self.sinks + [None] * (len(sources) - len(self.sinks))
            if self._u_rows is None and resolve_mix_backend(sources[0]) == "triton":
                # one stack of every query's u (autograd: one stack of the grads, not Q products), unless FSDP2
                # holds the other layers' queries sharded now: then () and each mix forms its own query's u
                self._u_rows = () if queries_sharded(self.queries) else stacked_u(self.queries).unbind(0)
            u = self._u_rows[i] if self._u_rows else None
            kw = dict(sinks=sinks, u=u, defer=self._defer(i, sources), chain=self.partial is not None and self._chain)
            if self._mix_norm and isinstance(norm, RMSNorm) and not _is_dtensor(norm.weight):
                h, alpha, *passed = mix_with_norm(sources, self.queries[i], norm, **kw)
                norm = None  # h is the sublayer's input already
            else:
                h, alpha, *passed = mix(sources, self.queries[i], **kw)
            if passed and passed[0] is not None:  # the next running sum is built from it (see mix)
                self.partial = passed[0]
        if self.record is not None:
            self.record.setdefault("alpha", []).append(alpha_stats(alpha, self.token_mask))
        return _normed(h, norm)

    def _defer(self, i: int, sources: list[torch.Tensor]) -> tuple | None:
        """``(DeferredBlock, flush)`` for sublayer ``i``'s mix when its block defers its source gradients (not the
        output's mix): the block's first mix in forward order flushes."""
        if self._deferred is None or i >= len(self.queries) - 1 or resolve_mix_backend(sources[0]) != "triton":
            return None
        from kernels.attn_res.mix_autograd import DeferredBlock
        from kernels.attn_res.mix_triton import use_args

        if not use_args(len(sources)):
            return None
        k = i // self.block_size
        flush = k not in self._deferred
        if flush:
            self._deferred[k] = DeferredBlock()
        return self._deferred[k], flush

    def _two_phase_input(self, i: int) -> torch.Tensor:
        j = i % self.block_size
        if j == 0:
            block_queries = self.queries[i: i + self.block_size]
            self._phase1 = phase1(self.completed, block_queries)
        o, m, l = (t[j] for t in self._phase1)
        return phase2(o, m, l, self.partial, self.queries[i]).to(self.completed[0].dtype)

    def add(self, i: int, out: torch.Tensor) -> None:
        if self._buffered is not None:
            self._buffered.add(i, out)
            return
        self.partial = out if self.partial is None else self.partial + out
        if self.record is not None:
            self.record.setdefault("sublayer_output_rms", []).append(rms(out))
        if (i + 1) % self.block_size == 0:
            if self.record is not None:
                self.record.setdefault("block_output_rms", []).append(rms(self.partial))
            self.completed.append(self.partial)
            self.partial = None
            if self.sinks is not None:
                self.sinks.append(self._sink_cls())

    def final(self, norm: nn.Module | None = None) -> torch.Tensor:
        return self.input(len(self.queries) - 1, norm)


class BufferedTwoPhase:
    """Two-phase block AttnRes without autograd through the Triton kernels: the block states are slots of one
    buffer ``v [K + 1, M, D]`` (slot 0 the embedding, slot ``k`` block ``k``'s completed sum, the last slot the
    current block's running sum), the queries one fp32 ``u [Q, D]``. ``add`` only holds the sublayer output; the
    next ``input``'s kernel adds it to the running sum (same rounding as ``slot + out``): a block's first sublayer
    runs phase 1, which stores the previous block's completed sum in its own slot and scores all the block's
    queries over the completed slots (and gives the sublayer its own mix); the others a phase-2 merge with the
    running sum. One kernel launch per sublayer in all. The running sum has a slot of its own so that phase 1's
    programs never read a slot that one of them writes (decode runs one program per query). Same interface as the
    stream's core."""

    def __init__(self, embeddings: torch.Tensor, queries: Sequence[ResQuery], block_size: int) -> None:
        from kernels.attn_res.two_phase_triton import TwoPhaseLauncher

        self.shape, d = embeddings.shape, embeddings.shape[-1]
        self.block_size, self.num_queries = block_size, len(queries)
        num_slots = 1 + -(-(len(queries) - 1) // block_size)
        self.running = num_slots  # the running sum's slot
        v = embeddings.new_empty(num_slots + 1, embeddings.numel() // d, d)  # [K + 1, M, D]
        self.run = TwoPhaseLauncher(v, query_table(queries), min(block_size, len(queries)), embeddings.shape)
        self.eps = [q.eps for q in queries]
        # (output of the last sublayer, first of its slot): the embedding is the first "output", stored in slot 0 by
        # the first phase 1 as it reads it (a copy into the buffer would be one more launch a decode step)
        self._pending: tuple[torch.Tensor, bool] | None = (embeddings.contiguous(), True)
        self._scratch: torch.Tensor | None = None  # one h buffer for every scratch input of this forward

    def input(self, i: int, scratch: bool = False, norm: tuple | None = None) -> torch.Tensor:
        """Sublayer ``i``'s ``h [B, T, D]``. ``scratch``: written into one buffer that every scratch call of this
        stream reuses (valid until the next ``input``; for a caller that only feeds it to a norm, or a sublayer, at
        once), which saves an allocation per sublayer in launch-bound decode. ``norm``: ``(gain, eps)`` of an RMSNorm
        the kernels apply to ``h`` before writing it."""
        j, k = i % self.block_size, i // self.block_size + 1
        pending, first = self._pending if self._pending is not None else (None, False)
        self._pending = None
        out = None
        if scratch:
            if self._scratch is None:
                self._scratch = torch.empty(self.shape, device=self.run.v.device, dtype=self.run.v.dtype)
            out = self._scratch
        if j == 0:
            return self.run.phase1(k, i, min(self.block_size, self.num_queries - i), self.eps[i], pending, first,
                                   out, norm, src_slot=self.running)
        return self.run.phase2(j, self.running, i, self.eps[i], pending, first, out, norm)

    def add(self, i: int, out: torch.Tensor) -> None:
        if self._pending is not None:
            raise ValueError(f"BufferedTwoPhase.add: sublayer {i} added before the previous output was consumed "
                             "(input(i) must follow every add)")
        if out.shape != self.shape:
            raise ValueError(f"BufferedTwoPhase.add: sublayer {i} output is {tuple(out.shape)}, the stream's "
                             f"embeddings {tuple(self.shape)}")
        if out.dtype != self.run.v.dtype:
            out = out.to(self.run.v.dtype)
        self._pending = (out if out.is_contiguous() else out.contiguous(), i % self.block_size == 0)
