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
def config_show(params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None,
                origin: Annotated[bool, typer.Option("--origin", help="a line per key: its value and where it came "
                                                     "from (default, a preset, the params file, an override)")]
                = False) -> None:
    """Print the resolved config as YAML (with --origin, each key's value and the layer that set it)."""
    import yaml

    if not origin:
        typer.echo(yaml.safe_dump(config_to_dict(config_or_exit(params, preset, overrides)), sort_keys=False,
                                  allow_unicode=True))
        return
    from ragen.config import ConfigError, flatten, load_config_with_origins

    try:
        cfg, origins = load_config_with_origins(params, preset or [], overrides or [])
    except ConfigError as e:
        fail(f"config error:\n{e}")
    flat = flatten(config_to_dict(cfg))
    width = max(len(k) for k in flat)
    for key, value in flat.items():
        shown = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...")
        typer.echo(f"{key:{width}s}  {shown:30s}  # {origins[key]}")


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
