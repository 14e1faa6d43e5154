"""The SFT stages (ragen.sft.pipeline) as Prefect tasks, plus MLflow logging of a warm-start. Stages never retry
(each rewrites its outputs from scratch; rerun the flow instead); tracking and versioning retry and are reported
rather than fatal, as in the training flow."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from prefect import task

from ragen.config import Config, config_to_dict, flatten
from ragen.sft import pipeline
from tasks.options import NO_RESULT


@task(name="make_demos", retries=0, **NO_RESULT)
def make_demos(cfg: Config) -> Path:
    return pipeline.make_demos_stage(cfg)


@task(name="evaluate_format", retries=0, **NO_RESULT)
def evaluate_format(cfg: Config, model_path: str | None, out: Path) -> dict[str, float]:
    return pipeline.evaluate_stage(cfg, model_path, out)


@task(name="train_sft", retries=0, **NO_RESULT)
def train_sft(cfg: Config, demos: Path) -> tuple[Path, dict[str, float]]:
    return pipeline.train_stage(cfg, demos)


@task(name="version_sft", retries=2, retry_delay_seconds=2, timeout_seconds=1800, **NO_RESULT)
def version_sft(cfg: Config, paths: list[Path]) -> dict[str, Any]:
    from tasks.versioning import version_paths

    return version_paths(paths, cfg.tracking.dvc_remote, cfg.tracking.dvc_push_timeout_s)


@task(name="log_sft", retries=0, **NO_RESULT)  # a retry would create a second MLflow run; a failure is reported
def log_sft(cfg: Config, result: dict[str, Any], checkpoint: Path) -> str:
    """One MLflow run in experiment ``<tracking.experiment>-sft``: the sft params, the loss per step, the
    format metrics before and after (``before/...``, ``after/...``) and the evaluation files as artifacts."""
    from mlflow.entities import Metric, Param

    from tasks.tracking import experiment_id, git_commit, mlflow_client

    client = mlflow_client(cfg)
    name = f"{cfg.tracking.experiment}-sft"
    exp_id = experiment_id(client, cfg, name)
    r = client.create_run(exp_id, run_name=checkpoint.name, tags={
        "git_commit": git_commit(), "preset": ",".join(cfg.preset) or "none", "checkpoint": str(checkpoint),
        "fingerprint": pipeline.fingerprint(cfg)})
    run_id = r.info.run_id
    params = [Param(k, json.dumps(v) if not isinstance(v, str) else v)
              for k, v in flatten({"sft": config_to_dict(cfg)["sft"], "model": config_to_dict(cfg)["model"]}).items()]
    client.log_batch(run_id, params=params)
    metrics = []
    for where in ("before", "after", "train"):
        for k, v in (result.get(where) or {}).items():
            if isinstance(v, int | float) and math.isfinite(v):
                metrics.append(Metric(f"{where}/{k}".replace("@", "_at_"), float(v), 0, 0))
    history = checkpoint / pipeline.HISTORY
    if history.is_file():
        for line in history.read_text().splitlines():
            rec = json.loads(line)
            metrics.append(Metric("sft/loss", rec["loss"], 0, int(rec["step"])))
    client.log_batch(run_id, metrics=metrics)  # MLflow batches them within its limits itself
    for f in (*pipeline.EVAL_FILES.values(), "sft.json", pipeline.HISTORY):
        if (checkpoint / f).is_file():
            client.log_artifact(run_id, str(checkpoint / f), "sft")
    client.set_terminated(run_id, "FINISHED")
    return run_id
