"""MLflow record of a ``ragen bench learn`` measurement (the plain loop logs nothing to MLflow while it trains):
one MLflow run per measurement, so the learning runs can be compared side by side in the MLflow UI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task

from ragen.config import load_config
from ragen.run.iteration import EVAL_INIT
from ragen.run.learn_bench import RESULT_JSON, RUN_NAME
from ragen.run.rundir import RunDir
from tasks.options import NO_RESULT
from tasks.tracking import experiment_id, git_commit, log_metrics, mlflow_client, rebuild_run

EXPERIMENT = "ragen-learning"  # measurements, kept apart from training runs and the grid
ARTIFACTS = ("learn.json", "curve.csv", "training.csv", "curve.png", "panel.json")


def result_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The before/after numbers of a learn.json as flat metrics: ``learn/<tag>/before``, ``.../diff_lo``, ..."""
    out: dict[str, float] = {}
    for tag, t in result["tags"].items():
        for key in ("before", "after", "diff", "score_before", "score_after", "format_errors_before",
                    "format_errors_after", "n"):
            out[f"learn/{tag}/{key}"] = float(t[key])
        for key in ("before_ci", "after_ci", "diff_ci"):
            lo, hi = t[key]
            out[f"learn/{tag}/{key[:-3]}_lo"], out[f"learn/{tag}/{key[:-3]}_hi"] = float(lo), float(hi)
    for key in ("wall_s", "s_per_iteration", "update_share", "rollout_share", "iterations", "rollbacks"):
        if isinstance(result.get(key), int | float):
            out[f"learn/{key}"] = float(result[key])
    return out


@task(name="log_learning", retries=3, retry_delay_seconds=2, **NO_RESULT)
def log_learning(out: str, tracking_uri: str | None = None) -> dict[str, Any]:
    """One finished measurement (its ``--out`` directory) as an MLflow run named after the directory, in the
    ``ragen-learning`` experiment: the run's params, each iteration's metrics at its step, the panel before
    training at step 0 as ``init/...``, the before/after result as ``learn/...`` and the files as artifacts. A run
    of that name already there is left as it is."""
    d = Path(out)
    if not (d / RESULT_JSON).is_file():
        raise FileNotFoundError(f"{d / RESULT_JSON} not found: give the --out directory of a finished "
                                f"`ragen bench learn`")
    result = json.loads((d / RESULT_JSON).read_text())
    run = RunDir.at(d, RUN_NAME)
    cfg = load_config(run.root / "config.yaml")
    if tracking_uri:
        cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(
            update={"mlflow_tracking_uri": tracking_uri})})
    client = mlflow_client(cfg)
    tags = {"git_commit": git_commit(), "measurement": str(d), "preset": ",".join(cfg.preset) or "none",
            "overrides": " ".join(result["config"].get("overrides", []))[:5000]}
    init = run.root / EVAL_INIT
    run_id, created = rebuild_run(client, cfg, experiment_id(client, cfg, EXPERIMENT), d.resolve().name, tags,
                                  json.loads(init.read_text()) if init.is_file() else None,
                                  ((k, run.metrics(k)) for k in run.completed()))
    if not created:
        return {"run": d.resolve().name, "run_id": run_id, "logged": False}
    log_metrics(client, run_id, len(run.completed()), result_metrics(result))
    for f in ARTIFACTS:
        if (d / f).is_file():
            client.log_artifact(run_id, str(d / f))
    client.set_terminated(run_id, "FINISHED")
    return {"run": d.resolve().name, "run_id": run_id, "logged": True}


def export_runs(tracking_uri: str, path: Path) -> Path:
    """The ``ragen-learning`` experiment's runs as one CSV (one row per run: its learn/* metrics and the settings
    that differ), the committed form of the MLflow comparison view."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    df = mlflow.search_runs(experiment_names=[EXPERIMENT])
    keep = ["tags.mlflow.runName", "start_time", "tags.git_commit", "tags.preset", "tags.overrides",
            *sorted(c for c in df.columns if c.startswith("metrics.learn/"))]
    params = [c for c in df.columns if c.startswith("params.")]
    varying = [c for c in params if df[c].astype(str).nunique() > 1]
    path.parent.mkdir(parents=True, exist_ok=True)
    df[[c for c in keep if c in df.columns] + varying].sort_values("tags.mlflow.runName").to_csv(path, index=False)
    return path
