"""Flow ``ragen-evaluate``: score a checkpoint (a model, checkpoint or run directory, or a registered MLflow
model such as ``ragen-actor@champion``) on a fixed seed panel, write ``eval.json`` + ``rollouts.parquet``, and
log the scores to MLflow. ``ragen eval`` calls it in-process; the dvc.yaml ``evaluate@<experiment>`` stages too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows import trust
from ragen.config import Config
from ragen.eval import evaluate as ev
from ragen.run.evaluation import resolve_checkpoint, reuse_run_evaluation
from tasks import evaluate as tasks
from tasks import model_registry


def model_to_score(cfg: Config, checkpoint: str | None, mlflow_model: str | None) -> tuple[str, dict[str, Any]]:
    """The model directory for ``--checkpoint`` or ``--mlflow-model`` (exactly one), and what it is."""
    if (checkpoint is None) == (mlflow_model is None):
        raise ValueError("give exactly one of --checkpoint PATH and --mlflow-model NAME@ALIAS")
    if mlflow_model is not None:
        return str(model_registry.download_model(cfg, mlflow_model)), {"mlflow_model": mlflow_model}
    model, info = resolve_checkpoint(checkpoint)  # type: ignore[arg-type]
    return str(model), info


@flow(name="ragen-evaluate", persist_result=False)
@trust.gated
def evaluate_flow(cfg: Config, out: str, checkpoint: str | None = None, mlflow_model: str | None = None,
                  greedy: bool = False, log: bool = True, reuse_run: bool = False) -> dict[str, Any]:
    """Score a checkpoint on ``eval.panel``; ``reuse_run``: when ``checkpoint`` is a run directory that already
    scored its last checkpoint on this panel with these settings (its final validation), take that evaluation."""
    logger = get_run_logger()
    model, info = model_to_score(cfg, checkpoint, mlflow_model)
    reused = reuse_run_evaluation(cfg, checkpoint, out) if reuse_run and checkpoint and not greedy else None
    if reused is not None:
        logger.info("%s scored %s on this panel during training (%s): reused", checkpoint, model, reused)
        metrics = ev.read_eval(out)["metrics"]
        info = {**info, "reused_from": reused}
    else:
        logger.info("scoring %s on panel %s (%s)", model, cfg.eval.panel, "greedy" if greedy else
                    f"T={cfg.rollout.val_temperature}")
        metrics = tasks.evaluate_model(cfg, model, out, greedy, info)
    result: dict[str, Any] = {"model": model, "out": str(Path(out)), "metrics": metrics, **info}
    if log:
        try:
            result["mlflow_run_id"] = tasks.log_evaluation(cfg, out, {**info, "model": model,
                                                                      "panel": cfg.eval.panel})
        except Exception as e:  # the evaluation is on disk either way
            logger.warning("MLflow logging of the evaluation failed (%s: %s)", type(e).__name__, e)
    return result
