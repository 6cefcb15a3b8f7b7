"""Ending a run's distributed state in an order that cannot hang or abort on gloo (CPU multi-process runs).

Two failures were seen at the end of a 2-process CPU DDP run (``tests/train/test_ddp.py``), each in roughly one
run of ten on a loaded 2-core machine:

- Exit without ``destroy_process_group``: the interpreter tears down while gloo's worker threads still hold
  finished work items whose tensors have Python objects; one rank aborted with ``terminate called without an
  active exception``.
- ``destroy_process_group`` while the DDP wrapper is still alive: the group's last reference is then the DDP
  reducer's, which is freed (when the wrapper is) on the main thread *holding the GIL*;
  ``~ProcessGroupGloo`` joins its worker threads, one of which is freeing a finished barrier (and the all-reduces
  it waited for) and waits for the GIL: a deadlock (``py-spy dump``: main thread in ``std::thread::join`` under
  ``c10d::Reducer::~Reducer``, the worker in ``gil_scoped_acquire`` under ``~AsyncBarrierWork``).

:func:`end_run` does it the safe way round: every rank waits for the others, the caller has dropped its
references to the prepared (DDP-wrapped) objects, accelerate drops its own (``free_memory``, which also collects
garbage), so the reducer dies while the process group is still registered, and only then is the group destroyed
(``end_training``, which also finishes the trackers) from Python, whose binding releases the GIL first.
"""

from __future__ import annotations

from typing import Any


def end_run(accelerator: Any) -> None:
    """Finish ``accelerator``'s trackers and destroy its process group (if any) after the DDP wrappers are gone.

    Call it once, at the very end, after dropping every reference the caller holds to the objects that
    ``accelerator.prepare`` returned (model, optimizer, scheduler, a compiled model). Single-process runs only
    finish their trackers."""
    if accelerator.num_processes > 1:
        accelerator.wait_for_everyone()
    accelerator.free_memory()
    accelerator.end_training()
