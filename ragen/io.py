"""Writes shared by every package: atomic (a reader sees the old file or the new one, never half of one) and, at a
commit point, durable (fsync'd, so that a power cut or a dead disk keeps what was declared complete)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_path(path: Path) -> None:
    """fsync a file, or a folder: a new name in a folder (a rename, a new file) is durable only once it is."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(root: Path) -> None:
    """Make every file and folder under ``root`` durable, deepest first, ``root`` last (symlinks left alone)."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            p = Path(folder) / name
            if not p.is_symlink():
                fsync_path(p)
        fsync_path(Path(folder))


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` beside ``path``, fsync it and rename it over, then fsync the folder: after a crash or a power
    cut ``path`` holds the old text or the new one, never an empty or half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fsync_path(path.parent)


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True, allow_nan=True) + "\n")
