"""`ragen runs ...` commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.common import (
    fail,
)

app = typer.Typer(no_args_is_help=True, help="Training runs on disk (runs/<name>).")


@app.command("compare")
def runs_compare_cmd(runs: Annotated[list[Path], typer.Argument(help="run directories (runs/<name>)")],
                     out: Annotated[Path | None, typer.Option(help="write summary.json, compare.md and compare.png "
                                                                   "here")] = None,
                     key: Annotated[list[str] | None, typer.Option(help="metrics to compare (repeatable)")] = None,
                     ) -> None:
    """Runs side by side: kept and rolled-back iterations, collapse-guard rollbacks, first vs last values."""
    from ragen.report.compare import KEYS, markdown, plot_compare, summarize

    keys = tuple(key or KEYS)
    missing = [str(r) for r in runs if not (r / "config.yaml").is_file()]
    if missing:
        fail(f"not run directories (no config.yaml): {', '.join(missing)}")
    rows = [summarize(r, keys) for r in runs]
    table = markdown(rows, keys)
    typer.echo(table)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
        (out / "compare.md").write_text(table + "\n")
        typer.echo(f"wrote {plot_compare(runs, out / 'compare.png', keys)}, {out / 'summary.json'}")
