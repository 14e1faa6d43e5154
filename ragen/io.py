"""Atomic writes shared by every package: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` beside ``path`` and rename it over (as tables.write_table does for parquet)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True, allow_nan=True) + "\n")
