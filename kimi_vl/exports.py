"""Where an export lives: every command that loads a trained model takes ``RUN`` or ``RUN/final``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def export_folder(path: str | os.PathLike, field: str = "init_from") -> Path:
    """``RUN`` or ``RUN/final`` -> the folder holding the export's ``config.json``.

    ``field`` names the option the path came from, so the error says which one to fix::

        FileNotFoundError: --checkpoint='runs/x': no such folder (expected an export folder such as RUN/final)
    """
    folder = Path(path)
    if (folder / "final" / "config.json").is_file():
        return folder / "final"
    if (folder / "config.json").is_file():
        return folder
    what = "no such folder" if not folder.exists() else "no config.json there"
    raise FileNotFoundError(f"{field}={str(path)!r}: {what} (expected an export folder such as RUN/final)")


def require_export(parser: argparse.ArgumentParser, path: str | os.PathLike, flag: str) -> Path:
    """:func:`export_folder`, or ``parser``'s usage error (one line, exit code 2) naming ``flag``."""
    try:
        return export_folder(path, flag)
    except FileNotFoundError as err:
        parser.error(str(err))


__all__ = ["export_folder", "require_export"]
