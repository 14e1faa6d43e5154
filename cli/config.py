"""`ragen config ...` commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import (
    ParamsOpt,
    PresetOpt,
    SetOpt,
    config_or_exit,
    fail,
)
from ragen.config import config_to_dict

app = typer.Typer(no_args_is_help=True, help="Resolve and show configs.")


@app.command("show")
def config_show(params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Print the resolved config as YAML."""
    import yaml

    typer.echo(yaml.safe_dump(config_to_dict(config_or_exit(params, preset, overrides)), sort_keys=False,
                              allow_unicode=True))


@app.command("params")
def config_params(params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Print the resolved config as a commented params file (how params.yaml is generated)."""
    from ragen.config import PARAMS_HEADER, commented_yaml
    from ragen.experiments import grid_yaml

    typer.echo(commented_yaml(config_or_exit(params, preset, overrides), PARAMS_HEADER) + grid_yaml(), nl=False)


@app.command("reference")
def config_reference(write: Annotated[Path | None, typer.Option(help="refresh the generated block of this page "
                                                                     "(docs/configuration.md) in place")] = None,
                     ) -> None:
    """Print the key reference generated from the schema (key, type, default, description), or refresh a page's."""
    from ragen.config_reference import reference_markdown, write_reference

    if write is None:
        typer.echo(reference_markdown(), nl=False)
        return
    try:
        changed = write_reference(write)
    except (OSError, ValueError) as e:
        fail(f"{write}: {e}")
    typer.echo(f"{write}: {'updated' if changed else 'already current'}")
