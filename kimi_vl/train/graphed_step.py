"""A training forward + backward of fixed-shape batches replayed as one CUDA graph.

The small models' steps launch about a thousand kernels (the ``small`` hybrid at 8 x 4096: 932, with block AttnRes
1059); the host's Python and launch time is close to the GPU's (``kimi_vl.benchmarks.step_timeline``), so steps
wait for the host wherever it falls behind. :class:`GraphedTrainStep` runs ``warmup`` steps eagerly on a side
stream (Triton compiles, cuBLAS workspaces, the AttnRes launchers bind their kernels), captures one more, and from
then on copies each batch into the captured input tensors and replays: one launch a step.

What a replay gives: the loss (a tensor in the graph's memory, overwritten by the next replay) and every
parameter's gradient in its ``.grad``, written (not accumulated) by each replay into the same tensors, which the
optimizer reads after the call. Hence: no gradient accumulation over calls (set the gradients aside first), the
same shapes, dtypes and device for every batch (a different one is an error naming the field), and nothing in the
step that synchronises the host (a capture error says where). The model's parameters must keep their storage (an
optimizer updates them in place, as every ``torch.optim`` optimizer does).
"""

from __future__ import annotations

import torch
from torch import nn

_WHERE = "kimi_vl/train/graphed_step.py"


class GraphedTrainStep:
    """``step(**batch) -> loss``: ``model(**batch).loss.backward()`` as a CUDA graph after ``warmup`` eager steps.

    ``batch``: keyword tensors for the model (e.g. ``input_ids``, ``labels``); ``captures`` counts graphs made
    (one unless the batch signature changes and ``recapture`` allows it)."""

    def __init__(self, model: nn.Module, warmup: int = 2, recapture: bool = False) -> None:
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ValueError(f"{_WHERE}: GraphedTrainStep needs a model on a CUDA device, got {device}")
        if warmup < 1:
            raise ValueError(f"{_WHERE}: warmup must be >= 1 (the first steps compile kernels), got {warmup}")
        self.model, self.warmup, self.recapture, self.device = model, warmup, recapture, device
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[str, torch.Tensor] = {}
        self.grads: list[tuple[nn.Parameter, torch.Tensor]] = []  # the captured gradients each replay writes
        self.loss: torch.Tensor | None = None
        self.captures = 0

    def __call__(self, **batch) -> torch.Tensor:
        """``batch``: the model's keyword arguments; tensors are copied into the captured inputs, anything else
        (e.g. ``use_cache=False``) is a constant of the capture."""
        if self.graph is not None and not self._same_signature(batch):
            if not self.recapture:
                raise ValueError(f"{_WHERE}: the batch changed since capture: {self._difference(batch)}; a graph "
                                 "replays fixed shapes (pass recapture=True to capture again)")
            self.graph, self.static, self.loss = None, {}, None
        if self.graph is None:
            self._capture(batch)
        for name, t in batch.items():
            if isinstance(t, torch.Tensor):
                self.static[name].copy_(t, non_blocking=True)
        self.graph.replay()
        for p, g in self.grads:  # (a zero_grad(set_to_none=True) since would have dropped them)
            p.grad = g
        return self.loss

    def _capture(self, batch: dict[str, torch.Tensor]) -> None:
        for name, t in batch.items():
            if isinstance(t, torch.Tensor) and t.device != self.device:
                raise ValueError(f"{_WHERE}: batch field {name!r} is on {t.device}; the model is on {self.device}")
        self.static = {name: t.detach().clone() if isinstance(t, torch.Tensor) else t for name, t in batch.items()}
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self._step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph):
                self.loss = self._step()
        except RuntimeError as err:
            self.graph = None
            raise RuntimeError(f"{_WHERE}: capturing the training step failed ({err}); the step must not "
                               "synchronise the host (no .item(), no host-side reads of tensors)") from err
        self.grads = [(p, p.grad) for p in self.model.parameters() if p.grad is not None]
        self.captures += 1

    def _step(self) -> torch.Tensor:
        self.model.zero_grad(set_to_none=True)  # the captured backward allocates the gradients it then writes
        loss = self.model(**self.static).loss
        loss.backward()
        return loss.detach()

    def _same_signature(self, batch: dict) -> bool:
        return self._difference(batch) == ""

    def _difference(self, batch: dict) -> str:
        """What differs from the captured batch ('' when nothing does)."""
        if batch.keys() != self.static.keys():
            return f"fields {sorted(batch)} instead of {sorted(self.static)}"
        for k, t in batch.items():
            s = self.static[k]
            if not isinstance(t, torch.Tensor) or not isinstance(s, torch.Tensor):
                if type(t) is not type(s) or t != s:
                    return f"field {k!r} is {t!r}, captured as {s!r}"
            elif (t.shape, t.dtype, t.device) != (s.shape, s.dtype, s.device):
                return (f"field {k!r} is {t.dtype} {tuple(t.shape)} on {t.device}, captured as {s.dtype} "
                        f"{tuple(s.shape)} on {s.device}")
        return ""
