"""Flow ``ragen-grid-restore-tracking``: the ablation grid's MLflow record rebuilt from its exported outputs under
reports/grid (a fresh clone, a lost or a new tracking database), so the MLflow UI can compare the committed grid
without training it again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import flow

from flows import trust
from flows.ablations import REPORT, REPORTS, grid_config
from ragen.experiments import read_grid
from ragen.report.grid import grid_dir
from tasks import grid as tasks


@flow(name="ragen-grid-restore-tracking", persist_result=False)
@trust.gated
def grid_restore_tracking(params: str = "params.yaml", reports: str = REPORTS, out: str = REPORT,
                          tracking_uri: str | None = None) -> dict[str, Any]:
    """Every scored run of the grid as a child of the sweep's parent run (one already there is kept), then the
    report on the parent. A run scored with other settings than params.yaml's now (its run name differs) is
    listed, not restored: its params would not be the ones that made its numbers."""
    grid = read_grid(params)
    res: dict[str, Any] = {"restored": [], "present": [], "not_scored": [], "other_settings": []}
    cfg = None
    for name, seed in grid.runs():
        d = grid_dir(reports, name, seed)
        _, cfg, run_name = grid_config(grid, name, seed)
        if tracking_uri:  # tracking settings are not part of a run's identity: the run name stays
            cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(
                update={"mlflow_tracking_uri": tracking_uri})})
        if not (d / "train.json").is_file() or not (d / "history.json").is_file():
            res["not_scored"].append(f"{name}-s{seed}")
            continue
        was = json.loads((d / "train.json").read_text()).get("run_name")
        if was != run_name:
            res["other_settings"].append(f"{name}-s{seed} (scored as {was}; params.yaml now gives {run_name})")
            continue
        r = tasks.restore_tracking(cfg, str(d))
        res["restored" if r["restored"] else "present"].append(r["run"])
    if cfg is not None and Path(out).is_file():
        res["mlflow_parent"] = tasks.log_report(cfg, out)
    return res
