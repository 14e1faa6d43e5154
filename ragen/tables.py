"""Tables on disk: atomic Parquet writes and reads that say which file is wrong and how to fix it; CSV rows for
plots and reports."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)  # atomic: a crash never leaves a half-written table
    return path


def read_table(path: str | Path, what: str, columns: Sequence[str], how_to_make: str) -> pd.DataFrame:
    """Read a table, naming ``what`` it is and ``how_to_make`` it again when it is missing or damaged."""
    path = Path(path)
    for versioned in (path, path.parent):  # a DVC-versioned table (a run's iteration folder) is restored, not remade
        pointer = versioned.with_name(versioned.name + ".dvc")
        if pointer.is_file():
            how_to_make = f"restore it with `dvc checkout {pointer}` (or `dvc pull {pointer}`)"
            break
    try:
        df = pd.read_parquet(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} file {path} does not exist; {how_to_make}") from None
    except Exception as e:
        raise ValueError(f"{what} file {path} is not a readable parquet table ({e}); delete it and "
                         f"{how_to_make}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} file {path} lacks columns {missing}; {how_to_make}")
    return df


def write_csv(rows: Sequence[dict[str, Any]], fields: Sequence[str], path: str | Path) -> Path:
    """Rows as a CSV with columns ``fields`` (a key a row lacks is an empty cell); NaN cells are left empty so
    plots (dvc plots, the report figures) skip them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(fields))
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})
    return path
