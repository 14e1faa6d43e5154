"""Tasks of the ablation grid: export a finished run's metrics to reports/grid, write the report, and log the
report to the sweep's parent MLflow run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from ragen.config import Config
from ragen.report import grid as grid_files
from ragen.run.rundir import RunDir
from tasks.tracking import _client, sweep_run

_OPTS = {"cache_policy": NO_CACHE, "persist_result": False}


@task(name="export_run", retries=0, **_OPTS)
def export_run(run_root: str, out: str, info: dict[str, Any]) -> dict[str, Any]:
    return grid_files.export_run(RunDir(Path(run_root)), Path(out), info)


@task(name="write_report", retries=0, **_OPTS)
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


@task(name="log_report", retries=3, retry_delay_seconds=2, **_OPTS)
def log_report(cfg: Config, report: str) -> str | None:
    """The report and its figures as artifacts of the sweep's parent run."""
    client = _client(cfg)
    parent = sweep_run(client, cfg)
    if parent is None:
        return None
    md = Path(report)
    client.log_artifact(parent, str(md), "report")
    if md.with_suffix("").is_dir():
        client.log_artifacts(parent, str(md.with_suffix("")), f"report/{md.stem}")
    client.set_terminated(parent, "FINISHED")  # the sweep's report is in: the parent no longer shows as running
    return parent
