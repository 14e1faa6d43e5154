"""Tasks of the ablation grid: export a finished run's metrics to reports/grid, write the report, log the
report to the sweep's parent MLflow run, and rebuild a run's MLflow record from its exported metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task

from ragen.config import Config
from ragen.report import grid as grid_files
from ragen.run.rundir import RunDir
from tasks.options import NO_RESULT
from tasks.tracking import experiment_id, git_commit, log_metrics, mlflow_client, rebuild_run, run_tags, sweep_run


@task(name="export_run", retries=0, **NO_RESULT)
def export_run(run_root: str, out: str, info: dict[str, Any]) -> dict[str, Any]:
    return grid_files.export_run(RunDir(Path(run_root)), Path(out), info)


@task(name="write_report", retries=0, **NO_RESULT)
def write_report(reports: str, runs: list[tuple[str, int]], scale: str, out: str,
                 overrides: list[str] | None = None) -> dict[str, Any]:
    import json

    from ragen.report.ablations import write_report as write

    results, missing = grid_files.load_results(reports, runs)
    notes = [f"Not scored yet: {', '.join(missing)}."] if missing else []
    if overrides:  # grid-wide changes to the scale (e.g. a smaller model) must be visible beside the numbers
        notes.append("Grid-wide overrides on top of the scale: " + ", ".join(f"`{o}`" for o in overrides) + ".")
    md = write(results, scale, out, title=f"Ablations at {scale}", notes=notes)
    rows = []
    for name, seed in runs:
        h = Path(grid_files.grid_dir(reports, name, seed)) / "history.json"
        if h.is_file():
            data = json.loads(h.read_text())
            rows += grid_files.curve_rows(f"{name}-s{seed}", data["iterations"], data.get("eval_init"))
    curves = grid_files.write_curves(rows, Path(out).with_suffix("") / "curves.csv")
    return {"report": str(md), "curves": str(curves), "scored": len(results), "missing": missing}


@task(name="log_report", retries=3, retry_delay_seconds=2, **NO_RESULT)
def log_report(cfg: Config, report: str) -> str | None:
    """The report and its figures as artifacts of the sweep's parent run."""
    client = mlflow_client(cfg)
    parent = sweep_run(client, cfg)
    if parent is None:
        return None
    md = Path(report)
    client.log_artifact(parent, str(md), "report")
    if md.with_suffix("").is_dir():
        client.log_artifacts(parent, str(md.with_suffix("")), f"report/{md.stem}")
    client.set_terminated(parent, "FINISHED")  # the sweep's report is in: the parent no longer shows as running
    return parent


@task(name="restore_tracking", retries=3, retry_delay_seconds=2, **NO_RESULT)
def restore_tracking(cfg: Config, out: str) -> dict[str, Any]:
    """A grid run's MLflow run rebuilt from what it exported to ``out`` (reports/grid/<name>-s<seed>/): the tags,
    knobs and params training gives it, as a child of the sweep's parent; each iteration's metrics at its step;
    the panel before training as ``init/...`` at step 0 and the final panel as ``panel/...``. A run of that name
    already in the experiment is left as it is, so restoring twice adds nothing. The rebuilt run is tagged
    ``ragen_restored_from`` (its ``git_commit`` is the restoring checkout's: the training commit is not exported)."""
    from ragen.eval.evaluate import read_eval

    d = Path(out)
    train = json.loads((d / "train.json").read_text())
    hist = json.loads((d / "history.json").read_text())
    name = train["run_name"]
    client = mlflow_client(cfg)
    tags = {**run_tags(client, cfg, str(train.get("run_dir", "")), git_commit()), "ragen_restored_from": str(d)}
    run_id, created = rebuild_run(client, cfg, experiment_id(client, cfg), name, tags, hist.get("eval_init"),
                                  enumerate(hist["iterations"]))  # a finished run's completed iterations: 0, 1, ...
    if not created:
        return {"run": name, "run_id": run_id, "restored": False}
    if (d / "eval").is_dir():
        ev = read_eval(d / "eval")
        log_metrics(client, run_id, int(ev.get("iteration", 0)), {f"panel/{k}": v for k, v in ev["metrics"].items()})
    client.set_terminated(run_id, "FINISHED")
    return {"run": name, "run_id": run_id, "restored": True}
