"""The MLflow model registry: each finished run's final actor as a version of ``<experiment>-actor``, the
``champion`` alias moved only to a better one, and a registered version back as a local model directory."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from prefect import task

from ragen.config import Config
from ragen.run.rundir import RunDir
from ragen.train.checkpoint import model_dir
from tasks.options import NO_RESULT
from tasks.tracking import mlflow_client

CHAMPION = "champion"


def model_name(cfg: Config) -> str:
    return cfg.tracking.registered_model or f"{cfg.tracking.experiment}-actor"


@task(name="register_model", retries=3, retry_delay_seconds=2, timeout_seconds=1800, **NO_RESULT)
def register_model(cfg: Config, run: RunDir, run_id: str) -> dict[str, Any] | None:
    """Register the final actor (safetensors + tokenizer, loadable as ``model.base``) as a model version; move
    the ``champion`` alias to it only if its final val score beats the current champion's."""
    done = run.completed()
    model = model_dir(run.state(done[-1])) if done else None  # a LoRA run's: the merged model
    if model is None:
        return None
    k = done[-1]
    ev = run.iteration(k) / "eval.json"
    score = json.loads(ev.read_text()).get("val/score") if ev.is_file() else None
    client = mlflow_client(cfg)
    name = model_name(cfg)
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description="final actors of ragen training runs")
    where = f"model/iter_{k:05d}"  # per iteration: a continued run's next version must not overwrite this one
    mine = [v for v in client.search_model_versions(f"name='{name}'")
            if v.run_id == run_id and v.tags.get("iteration") == str(k)]  # a retry, or a restart of a finished run
    if not mine:
        client.log_artifacts(run_id, str(model), where)
    tags = {"iteration": str(k), "run_dir": str(run.root)}
    if score is not None:
        tags["val_score"] = repr(float(score))
    mv = mine[0] if mine else client.create_model_version(
        name, f"{client.get_run(run_id).info.artifact_uri}/{where}", run_id=run_id, tags=tags)
    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
        best = float(current.tags.get("val_score", "-inf"))
    except MlflowException:
        current, best = None, -math.inf
    promoted = score is not None and float(score) > best and (current is None or current.version != mv.version)
    if promoted:
        client.set_registered_model_alias(name, CHAMPION, mv.version)
    return {"name": name, "version": int(mv.version), "val_score": score, "champion": promoted,
            "previous_champion": int(current.version) if current is not None else None}


def download_model(cfg: Config, spec: str, dest_root: str | Path = "models/mlflow") -> Path:
    """A registered model version as a local model directory: ``NAME@ALIAS`` (e.g. ``ragen-actor@champion``) or
    ``NAME/VERSION``; downloaded once to ``dest_root/NAME-vVERSION``."""
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException

    name, sep, which = spec.partition("@") if "@" in spec else spec.partition("/")
    if not name or not sep or not which:
        raise ValueError(f"--mlflow-model {spec!r}: give NAME@ALIAS (e.g. {model_name(cfg)}@{CHAMPION}) or "
                         f"NAME/VERSION")
    client = mlflow_client(cfg)
    try:
        mv = client.get_model_version_by_alias(name, which) if sep == "@" else client.get_model_version(name, which)
    except MlflowException as e:
        raise ValueError(f"--mlflow-model {spec!r}: no such registered model version at "
                         f"{cfg.tracking.mlflow_tracking_uri} ({e.message})") from None
    dest = Path(dest_root) / f"{name}-v{mv.version}"
    if not (dest / "config.json").is_file():
        tmp = dest.with_name(dest.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        download_artifacts(artifact_uri=mv.source, dst_path=str(tmp), tracking_uri=cfg.tracking.mlflow_tracking_uri)
        got = next((p.parent for p in tmp.rglob("config.json")), None)
        if got is None:
            raise ValueError(f"--mlflow-model {spec!r}: version {mv.version} at {mv.source} holds no model "
                             f"(config.json)")
        shutil.rmtree(dest, ignore_errors=True)
        got.rename(dest)
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
