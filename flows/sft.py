"""Flow ``ragen-sft`` (deployment ``ragen-sft/sft``): make demos -> evaluate the base model's format -> SFT ->
evaluate the checkpoint (ragen.sft.pipeline.run_sft over the tasks of tasks/sft.py), then DVC-version the demos
and the checkpoint and log the warm-start to MLflow. ``ragen sft`` calls it in-process; the training flow calls
it first when ``model.warm_start=auto`` finds no checkpoint made from its settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows import trust
from ragen.config import load_config
from ragen.sft import pipeline
from tasks import sft as tasks


@flow(name="ragen-sft", flow_run_name="sft", persist_result=False)
@trust.gated
def sft_flow(params: str | None = "params.yaml", preset: list[str] | None = None,
             overrides: list[str] | None = None, evaluate: bool = True, version: bool = True) -> dict[str, Any]:
    """Warm-start of config = params file <- presets <- overrides (``key=value``)."""
    log = get_run_logger()
    cfg = load_config(params, list(preset or []), list(overrides or []))
    result = pipeline.run_sft(cfg, ops=tasks, evaluate=evaluate)
    for when in ("before", "after"):
        if when in result:
            log.info("%s SFT: format-valid %.3f (mean over %s)", when, result[when]["format_valid_mean"],
                     ", ".join(cfg.sft.tags))
    path = Path(result["checkpoint"])
    if version and cfg.tracking.dvc:
        try:
            result["dvc"] = tasks.version_sft(cfg, [Path(result["demos"]), path])
        except Exception as e:  # the checkpoint is on disk either way
            log.warning("DVC versioning of the warm-start failed (%s: %s); the checkpoint is at %s",
                        type(e).__name__, e, path)
    try:
        result["mlflow_run_id"] = tasks.log_sft(cfg, result, path)
    except Exception as e:
        log.warning("MLflow logging of the warm-start failed (%s: %s)", type(e).__name__, e)
    return result
