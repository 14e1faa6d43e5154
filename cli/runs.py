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


@app.command("verify")
def runs_verify_cmd(repo: Annotated[Path, typer.Option(help="the DVC repository (the project)")] = Path("."),
                    remote: Annotated[str | None, typer.Option(help="DVC remote (default: the repo's)")] = None,
                    repair: Annotated[bool, typer.Option("--repair/--check-only",
                                                         help="replace a damaged copy by the good one")] = True,
                    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Hash every DVC object in the cache and on a filesystem remote; a damaged copy is replaced by the good one
    (exit 1 when an object has no good copy left)."""
    from tasks.dvc_verify import verify_objects

    res = verify_objects(repo, remote, repair=repair)
    if as_json:
        typer.echo(json.dumps(res.to_dict(), indent=1))
    else:
        verb = "restored" if repair else "damaged"
        typer.echo(f"{res.checked} object copies hashed; cache {verb}: {len(res.restored_cache)}, remote {verb}: "
                   f"{len(res.restored_remote)}, lost: {len(res.lost)}" + (f" ({res.unchecked})" if res.unchecked
                                                                          else ""))
        if res.leftovers:
            typer.echo(f"{len(res.leftovers)} temporary file(s) of an interrupted transfer (no pointer names them; "
                       f"delete them when no DVC command runs): {', '.join(res.leftovers[:5])}")
        if res.restored_cache and repair:
            typer.echo("workspace files hardlinked to a repaired cache object keep the damage until `dvc checkout "
                       "--force` (of their .dvc pointers) relinks them")
    if res.lost:
        fail(f"objects with no good copy in the cache or on the remote: {', '.join(res.lost)}; the runs that "
             f"versioned them cannot be checked out whole", 1)
