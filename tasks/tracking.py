"""MLflow tracking of a training run: one MLflow run per run directory (its id is kept in the run directory, so
a resumed run keeps logging to the same MLflow run), flattened params, tags, metrics with step = iteration.

Logging never stops training: each call is retried and, if the tracking server still fails, reported in the log
and in ``<run>/tracking-failures.jsonl``; the iteration's data is already on disk either way."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from ragen.config import Config, config_to_dict, flatten
from ragen.run.rundir import RunDir

RUN_ID = "mlflow-run-id"
FAILURES = "tracking-failures.jsonl"
_BAD_NAME = re.compile(r"[^\w\-. :/]")
_OPTS = {"cache_policy": NO_CACHE, "persist_result": False}


def _client(cfg: Config) -> Any:
    import mlflow

    mlflow.set_tracking_uri(cfg.tracking.mlflow_tracking_uri)
    return mlflow.MlflowClient(cfg.tracking.mlflow_tracking_uri)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def experiment_id(client: Any, cfg: Config) -> str:
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    if exp is not None:
        return exp.experiment_id
    location = Path(cfg.tracking.mlflow_artifact_location).resolve().as_uri()
    return client.create_experiment(cfg.tracking.experiment, artifact_location=location)


@task(name="start_tracking", retries=3, retry_delay_seconds=2, **_OPTS)
def start_tracking(cfg: Config, run: RunDir) -> str:
    """The MLflow run of this run directory: created with params and tags on the first start, reused after."""
    client = _client(cfg)
    id_file = run.root / RUN_ID
    if id_file.is_file():
        run_id = id_file.read_text().strip()
        client.update_run(run_id, status="RUNNING")
        return run_id
    tags = {"git_commit": git_commit(), "preset": ",".join(cfg.preset) or "none",
            "experiment": cfg.tracking.experiment, "run_dir": str(run.root)}
    r = client.create_run(experiment_id(client, cfg), run_name=run.root.name, tags=tags)
    from mlflow.entities import Param

    params = [Param(k, (v if isinstance(v, str) else json.dumps(v))[:6000])  # MLflow's value length limit
              for k, v in flatten(config_to_dict(cfg)).items()]
    for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(r.info.run_id, params=params[i:i + 100])
    client.log_artifact(r.info.run_id, str(run.root / "config.yaml"))
    id_file.write_text(r.info.run_id + "\n")
    return r.info.run_id


def metric_name(key: str) -> str:
    """MLflow allows alphanumerics and ``_-. :/`` in names: ``pass@4`` becomes ``pass_at_4``."""
    return _BAD_NAME.sub("_", key.replace("@", "_at_"))


@task(name="log_iteration", retries=3, retry_delay_seconds=2, **_OPTS)
def log_iteration(cfg: Config, run_id: str, k: int, metrics: dict[str, float]) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    ms = [Metric(metric_name(key), float(v), now, k) for key, v in sorted(metrics.items())
          if isinstance(v, int | float)]
    client = _client(cfg)
    for i in range(0, len(ms), 1000):
        client.log_batch(run_id, metrics=ms[i:i + 1000])


@task(name="end_tracking", retries=3, retry_delay_seconds=2, **_OPTS)
def end_tracking(cfg: Config, run_id: str, status: str = "FINISHED") -> None:
    _client(cfg).set_terminated(run_id, status=status)


def reported(run: RunDir, what: str, fn: Any, *args: Any) -> Any:
    """Call a tracking task; after its retries, record the failure instead of raising."""
    try:
        return fn(*args)
    except Exception as e:  # tracking must never stop training
        get_run_logger().warning("MLflow %s failed after retries: %s", what, e)
        with (run.root / FAILURES).open("a") as f:
            f.write(json.dumps({"what": what, "error": repr(e), "time": time.time()}) + "\n")
        return None
