"""Prefect tasks of the evaluation flow: score a model on a panel, and log the scores to MLflow (into the
training run the checkpoint came from, else into a run of ``<experiment>-eval``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from prefect import task

from ragen.config import Config
from ragen.eval import evaluate as ev
from ragen.run.rundir import RunDir
from tasks.options import NO_RESULT
from tasks.tracking import experiment_id, git_commit, log_metrics, mlflow_client, read_run_id


@task(name="evaluate_model", retries=0, **NO_RESULT)
def evaluate_model(cfg: Config, model: str, out: str, greedy: bool, info: dict[str, Any]) -> dict[str, float]:
    return ev.evaluate_model(cfg, model, out, greedy=greedy, info=info)


@task(name="log_evaluation", retries=3, retry_delay_seconds=2, **NO_RESULT)
def log_evaluation(cfg: Config, out: str, info: dict[str, Any]) -> str:
    """Metrics as ``panel/<tag>/<metric>`` at the checkpoint's iteration, eval.json as an artifact."""
    client = mlflow_client(cfg)
    run_id = read_run_id(RunDir(Path(info["run_dir"]))) if info.get("run_dir") else None
    if run_id is None:
        exp_id = experiment_id(client, cfg, cfg.tracking.experiment + "-eval")
        run_id = client.create_run(exp_id, run_name=Path(out).name, tags={
            "git_commit": git_commit(), "model": str(info.get("model")), "panel": str(info.get("panel"))}).info.run_id
        client.set_terminated(run_id)
    data = ev.read_eval(out)
    step = int(info.get("iteration", 0))
    log_metrics(client, run_id, step, {f"panel/{k}": v for k, v in data["metrics"].items()})
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"eval-{Path(out).name}.json"
        p.write_text(json.dumps(data, indent=1))
        client.log_artifact(run_id, str(p), "eval")
    return run_id
