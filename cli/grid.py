"""`ragen grid ...` commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import (
    fail,
    print_panel,
)
from ragen.config import ConfigError

app = typer.Typer(no_args_is_help=True, help="The ablation grid of params.yaml's `experiments` block (what the "
                                                  "dvc.yaml ablation stages run).")


GridParams = Annotated[Path, typer.Option("--params", help="params file with the `experiments` block")]


GridReports = Annotated[Path, typer.Option(help="per-run grid outputs")]


def _grid_call(fn: object, *args: object) -> dict:
    from ragen.run.rundir import ResumeError
    from tasks.versioning import VersioningError

    try:
        return fn(*args)  # type: ignore[operator]
    except (KeyError, ValueError, FileNotFoundError, ConfigError, ResumeError, VersioningError) as e:
        fail(str(e.args[0] if isinstance(e, KeyError) else e))


@app.command("list")
def grid_list(params: GridParams = Path("params.yaml")) -> None:
    """The grid's runs (experiment x seed) at its scale, with their run names."""
    from flows.ablations import grid_config
    from ragen.experiments import read_grid

    g = _grid_call(read_grid, params)
    typer.echo(f"scale {g.scale}, sweep {g.sweep_name}, {len(g.runs())} runs")
    for name, seed in g.runs():
        r, cfg, run_name = grid_config(g, name, seed)
        typer.echo(f"  {name:24s} seed {seed}  runs/{run_name}  ({cfg.trainer.total_training_steps} iterations, "
                   f"{r.experiment.description})")


# dvc.yaml's stage commands pass "$DVC_STAGE" (the stage's name, set by DVC) rather than params.yaml values spliced
# into the command line, which DVC hands to a shell.
GridStage = Annotated[str | None, typer.Option("--stage", help="a DVC stage name, <stage>@<experiment>-<seed> (what "
                                                "dvc.yaml passes as \"$DVC_STAGE\"), instead of --name and --seed")]


def _which_run(name: str | None, seed: int, stage: str | None, params: Path) -> tuple[str, int]:
    from ragen.experiments import read_grid

    if stage is None:
        if name is None:
            fail("name the grid run: --name EXPERIMENT [--seed N], or --stage <stage>@<experiment>-<seed>")
        return name, seed
    if name is not None:
        fail("give either --stage or --name/--seed, not both")
    if "@" not in stage:
        fail(f"--stage {stage!r} is not a matrix stage's name (<stage>@<experiment>-<seed>)")
    return _grid_call(lambda: read_grid(params).run_of_item(stage.split("@", 1)[1]))


@app.command("train")
def grid_train_cmd(name: Annotated[str | None, typer.Option(help="experiment name")] = None, seed: int = 0,
                   stage: GridStage = None, params: GridParams = Path("params.yaml"),
                   reports: GridReports = Path("reports/grid")) -> None:
    """Train one grid run (continuing it if it exists) and export its metrics to reports/grid/<name>-s<seed>/."""
    from flows.ablations import grid_train

    name, seed = _which_run(name, seed, stage, params)
    s = _grid_call(grid_train, name, seed, str(params), str(reports))
    typer.echo(f"{name} seed {seed}: {s['iterations']} iterations in {s['run_dir']}; val score "
               f"{s.get('val/score', float('nan')):.3f}")


@app.command("eval")
def grid_eval_cmd(name: Annotated[str | None, typer.Option(help="experiment name")] = None, seed: int = 0,
                  stage: GridStage = None, params: GridParams = Path("params.yaml"),
                  reports: GridReports = Path("reports/grid")) -> None:
    """Score one trained grid run's last checkpoint on the panel (reports/grid/<name>-s<seed>/eval/)."""
    from flows.ablations import grid_evaluate

    name, seed = _which_run(name, seed, stage, params)
    res = _grid_call(grid_evaluate, name, seed, str(params), str(reports))
    print_panel(res["metrics"])


@app.command("panel")
def grid_panel_cmd(params: GridParams = Path("params.yaml"),
                   out_dir: Annotated[Path, typer.Option(help="folder of the panels")] = Path("data/panels")) -> None:
    """Write the fixed evaluation panel of the grid's scale (experiments.scale) to <out-dir>/<scale>.json: what
    `ragen eval panel --scale SCALE` writes."""
    from cli.evaluate import eval_panel_cmd
    from ragen.experiments import read_grid

    scale = _grid_call(read_grid, params).scale
    eval_panel_cmd(out=out_dir / f"{scale}.json", scale=scale)


@app.command("report")
def grid_report_cmd(params: GridParams = Path("params.yaml"), reports: GridReports = Path("reports/grid"),
                    out: Annotated[Path, typer.Option(help="report markdown (figures beside it)")]
                    = Path("reports/ablations.md")) -> None:
    """Write the ablation report (ours vs the paper, verdicts, figures, Echo Trap table) from the scored runs."""
    from flows.ablations import grid_report

    res = _grid_call(grid_report, str(params), str(reports), str(out))
    typer.echo(f"wrote {res['report']} ({res['scored']} runs scored"
               + (f"; not yet: {', '.join(res['missing'])}" if res["missing"] else "") + f"), curves {res['curves']}")


@app.command("plots")
def grid_plots_cmd(out: Annotated[Path, typer.Option(help="folder for index.html")] = Path("reports/plots"),
                   repo: Annotated[Path, typer.Option(help="the DVC project (its dvc.yaml plots)")] = Path("."))\
        -> None:
    """`dvc plots show` with vega, vega-lite and vega-embed inlined, so the page renders offline (DVC's own page
    loads them from a CDN). The scripts come once from their npm packages into ~/.cache/ragen/vega."""
    from tasks.vega_offline import ensure_template, render_dvc_plots

    try:
        page = render_dvc_plots(repo, out, ensure_template())
    except (FileNotFoundError, RuntimeError) as e:
        fail(str(e))
    typer.echo(f"wrote {page} (self-contained: open it in any browser, no network needed)")


@app.command("run")
def grid_run_cmd(params: GridParams = Path("params.yaml"), reports: GridReports = Path("reports/grid"),
                 out: Annotated[Path, typer.Option(help="report markdown")] = Path("reports/ablations.md")) -> None:
    """The whole grid without DVC: every run not yet scored (train, evaluate), then the report."""
    from flows.ablations import ablations_flow

    res = _grid_call(ablations_flow, str(params), str(reports), str(out))
    typer.echo(f"wrote {res['report']} ({res['scored']} runs scored)")


@app.command("mlflow-restore")
def grid_mlflow_restore_cmd(params: GridParams = Path("params.yaml"), reports: GridReports = Path("reports/grid"),
                            out: Annotated[Path, typer.Option(help="the report, logged on the sweep's parent run")]
                            = Path("reports/ablations.md"),
                            tracking_uri: Annotated[str | None, typer.Option(
                                help="MLflow tracking URI (default: the grid config's tracking.mlflow_tracking_uri)")]
                            = None) -> None:
    """Rebuild the grid's MLflow runs from reports/grid (a fresh clone, a lost or new tracking database): each
    scored run as a child of the sweep's parent with its params, knobs, per-iteration and panel metrics. Runs
    already in MLflow are kept; running it twice adds nothing."""
    from flows.grid_tracking import grid_restore_tracking

    res = _grid_call(grid_restore_tracking, str(params), str(reports), str(out), tracking_uri)
    typer.echo(f"restored {len(res['restored'])} runs, {len(res['present'])} already in MLflow"
               + (f"; not scored: {', '.join(res['not_scored'])}" if res["not_scored"] else ""))
    for line in res["other_settings"]:
        typer.secho(f"not restored, scored with other settings: {line}", err=True, fg="yellow")
