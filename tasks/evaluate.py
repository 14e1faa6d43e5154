"""Prefect tasks of the evaluation flow: score a model on a panel, and log the scores to MLflow (into the
training run the checkpoint came from, else into a run of ``<experiment>-eval``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from ragen.config import Config
from ragen.eval import evaluate as ev
from ragen.run.rundir import RunDir
from tasks.tracking import _client, _log_metrics, experiment_id, git_commit, read_run_id

_OPTS = {"cache_policy": NO_CACHE, "persist_result": False}


@task(name="evaluate_model", retries=0, **_OPTS)
def evaluate_model(cfg: Config, model: str, out: str, greedy: bool, info: dict[str, Any]) -> dict[str, float]:
    return ev.evaluate_model(cfg, model, out, greedy=greedy, info=info)


@task(name="log_evaluation", retries=3, retry_delay_seconds=2, **_OPTS)
def log_evaluation(cfg: Config, out: str, info: dict[str, Any]) -> str:
    """Metrics as ``panel/<tag>/<metric>`` at the checkpoint's iteration, eval.json as an artifact."""
    client = _client(cfg)
    run_id = read_run_id(RunDir(Path(info["run_dir"]))) if info.get("run_dir") else None
    if run_id is None:
        exp_id = experiment_id(client, cfg, cfg.tracking.experiment + "-eval")
        run_id = client.create_run(exp_id, run_name=Path(out).name, tags={
            "git_commit": git_commit(), "model": str(info.get("model")), "panel": str(info.get("panel"))}).info.run_id
        client.set_terminated(run_id)
    data = ev.read_eval(out)
    step = int(info.get("iteration", 0))
    _log_metrics(client, run_id, step, {f"panel/{k}": v for k, v in data["metrics"].items()})
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"eval-{Path(out).name}.json"
        p.write_text(json.dumps(data, indent=1))
        client.log_artifact(run_id, str(p), "eval")
    return run_id
