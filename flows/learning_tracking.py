"""Flow ``ragen-learn-tracking``: finished ``ragen bench learn`` measurements logged to MLflow (experiment
``ragen-learning``) and, if asked, the experiment exported as a CSV for the repository."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from flows import trust
from ragen.config import load_config
from tasks import learning as tasks


@flow(name="ragen-learn-tracking", persist_result=False)
@trust.gated
def learn_tracking(outs: list[str], tracking_uri: str | None = None, export: str | None = None) -> dict[str, Any]:
    """Each measurement directory as an MLflow run (kept when already there); then the CSV export."""
    uri = tracking_uri or load_config("params.yaml" if Path("params.yaml").is_file() else None
                                      ).tracking.mlflow_tracking_uri
    logged = [tasks.log_learning(o, uri) for o in outs]
    res: dict[str, Any] = {"runs": logged, "tracking_uri": uri}
    if export:
        res["export"] = str(tasks.export_runs(uri, Path(export)))
    return res
