"""Flow ``ragen-ablations``: the grid of params.yaml's ``experiments`` block, train -> evaluate per experiment
and seed, then the report (the same steps the dvc.yaml ``ablation-*`` stages run one by one). Every run is a
child of the sweep's MLflow parent run, tagged with its experiment and knobs; runs live in ``runs/`` and, as
with `dvc repro`, are not DVC-versioned per iteration (the stage outputs under reports/ are)."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows import trust
from flows.evaluate import evaluate_flow
from flows.train_loop import train_loop
from ragen.config import Config, load_config
from ragen.experiments import Grid, Resolved, read_grid
from ragen.report.grid import grid_dir
from ragen.run.identity import config_name
from tasks import grid as tasks

REPORTS = "reports/grid"
REPORT = "reports/ablations.md"
GRID_OVERRIDES = ("tracking.dvc=false",)  # the pipeline versions the grid's outputs; no nested DVC commands


def grid_config(grid: Grid, name: str, seed: int) -> tuple[Resolved, Config, str]:
    """One grid run's resolution, config and run name (``<experiment>-s<seed>-<config hash>``: a changed
    setting is a new run, never a refused restart of the old one)."""
    r = grid.settings(name, seed)
    cfg = load_config(None, list(r.presets), [*r.overrides, *GRID_OVERRIDES])
    return r, cfg, f"{r.run_name}-{config_name(cfg)[2:8]}"


@flow(name="ragen-grid-train", flow_run_name="{name}-s{seed}", persist_result=False)
@trust.gated
def grid_train(name: str, seed: int = 0, params: str = "params.yaml", reports: str = REPORTS) -> dict[str, Any]:
    grid = read_grid(params)
    r, _, run_name = grid_config(grid, name, seed)
    out = train_loop(run_name=run_name, params=None, preset=list(r.presets),
                     overrides=[*r.overrides, *GRID_OVERRIDES])
    info = {"experiment": name, "seed": seed, "scale": grid.scale, "run_name": run_name,
            "mlflow_run_id": out["mlflow_run_id"]}
    return tasks.export_run(out["run_dir"], str(grid_dir(reports, name, seed)), info)


@flow(name="ragen-grid-evaluate", flow_run_name="{name}-s{seed}", persist_result=False)
@trust.gated
def grid_evaluate(name: str, seed: int = 0, params: str = "params.yaml", reports: str = REPORTS) -> dict[str, Any]:
    import json

    grid = read_grid(params)
    _, cfg, _ = grid_config(grid, name, seed)
    trained = grid_dir(reports, name, seed) / "train.json"
    if not trained.is_file():
        raise FileNotFoundError(f"{trained} does not exist: train the run first (`ragen grid train --name {name} "
                                f"--seed {seed}` or `dvc repro ablation-train@{name}-{seed}`)")
    run_dir = json.loads(trained.read_text())["run_dir"]  # the run the train stage made, not a recomputed name
    return evaluate_flow(cfg, str(grid_dir(reports, name, seed) / "eval"), checkpoint=run_dir, reuse_run=True)


@flow(name="ragen-grid-report", persist_result=False)
@trust.gated
def grid_report(params: str = "params.yaml", reports: str = REPORTS, out: str = REPORT) -> dict[str, Any]:
    grid = read_grid(params)
    res = tasks.write_report(reports, grid.runs(), grid.scale, out, list(grid.overrides))
    _, cfg, _ = grid_config(grid, grid.run[0], grid.seeds[0])
    try:
        res["mlflow_parent"] = tasks.log_report(cfg, res["report"])
    except Exception as e:  # the report is on disk either way
        get_run_logger().warning("MLflow logging of the report failed (%s: %s)", type(e).__name__, e)
    return res


@flow(name="ragen-ablations", persist_result=False)
@trust.gated
def ablations_flow(params: str = "params.yaml", reports: str = REPORTS, out: str = REPORT) -> dict[str, Any]:
    """Every run of the grid not yet scored (train, then evaluate), then the report."""
    import json

    grid = read_grid(params)
    for name, seed in grid.runs():
        d = grid_dir(reports, name, seed)
        done = (d / "eval" / "eval.json").is_file() and (d / "train.json").is_file() and \
            json.loads((d / "train.json").read_text()).get("run_name") == grid_config(grid, name, seed)[2]
        if not done:  # not scored, or scored with other settings
            grid_train(name, seed, params, reports)
            grid_evaluate(name, seed, params, reports)
    return grid_report(params, reports, out)
