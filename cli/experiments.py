"""`ragen experiments ...` commands."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.common import (
    config_or_exit,
    fail,
)
from ragen.config import config_to_dict

app = typer.Typer(no_args_is_help=True, help="The paper's ablations as named experiments.")


@app.command("list")
def experiments_list(finding: Annotated[str | None, typer.Option(help="only this table/figure, e.g. table3")]
                     = None) -> None:
    """The named experiments: name, the paper finding, scales, description."""
    from ragen.experiments import EXPERIMENTS

    for e in EXPERIMENTS.values():
        if finding is None or e.finding == finding:
            typer.echo(f"{e.name:24s} {e.kind:5s} {e.finding or '-':7s} {','.join(e.scales):16s} {e.description}")


@app.command("show")
def experiments_show(name: str, scale: Annotated[str, typer.Option(help="cpu-small | paper")] = "cpu-small",
                     seed: int = 0) -> None:
    """The presets and overrides one experiment runs with at a scale, and its resolved config."""
    from ragen.experiments import experiment_settings

    try:
        r = experiment_settings(name, scale, seed)
    except KeyError as e:
        fail(str(e.args[0]))
    typer.echo(f"# {r.experiment.description}\n# presets: {' '.join(r.presets)}\n# overrides:")
    for o in r.overrides:
        typer.echo(f"#   {o}")
    import yaml

    cfg = config_or_exit(None, list(r.presets), list(r.overrides))
    typer.echo(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
