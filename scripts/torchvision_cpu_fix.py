"""Make PyPI's CUDA-linked torchvision importable on a CPU-only torch.

PyPI ships torchvision built against CUDA torch. With a CPU torch its C++ extension does not load,
and ``torchvision/_meta_registrations.py`` then fails at import with
``RuntimeError: operator torchvision::nms does not exist``, which breaks ``import timm``, the
``accelerate`` CLI and transformers' image processors.

``scripts/setup.sh`` copies this file into the virtual environment's site-packages (as
``_kvl_torchvision_cpu_fix``) with a ``.pth`` line importing it, and only when the installed torch is
a CPU build. At interpreter start it installs a finder that does nothing until ``torchvision`` is
first imported; it then (and only if ``torch.version.cuda`` is None) declares the schemas of the
C++ ops that torchvision registers fake kernels for, and steps aside. torchvision's C++ ops
(``nms``, ``roi_align``, ...) still raise if called; nothing in this project calls them.
"""

import importlib.abc
import sys

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARY = None  # keeps the torch.library fragment alive


def _declare_missing_ops() -> None:
    global _LIBRARY
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        try:
            lib.define(schema)
        except RuntimeError:  # already defined (e.g. by a working C++ extension)
            pass
    _LIBRARY = lib


class _TorchvisionFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            try:
                _declare_missing_ops()
            except Exception as exc:  # never break an import because of this hook
                print(f"[kvl] torchvision CPU fix skipped: {exc}", file=sys.stderr)
        return None


if not any(isinstance(f, _TorchvisionFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _TorchvisionFinder())
