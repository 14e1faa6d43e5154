"""Files of the ablation grid under ``reports/grid/<experiment>-s<seed>/`` (small, git- or DVC-tracked; the run
directories with their checkpoints stay in ``runs/``): ``train.json`` (the run's final metrics), ``history.json``
(metrics per iteration, the pre-training evaluation first), ``eval/eval.json`` (the final checkpoint on the panel);
and the long-format ``curves.csv`` that ``dvc plots`` draws, one row per (run, iteration)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragen.io import write_json
from ragen.report.verdicts import GridResult
from ragen.run.iteration import EVAL_INIT
from ragen.run.rundir import RunDir
from ragen.tables import write_csv

CURVES = ("val_success", "val_score", "train_success", "in_group_std", "entropy", "grad_norm", "echo_warning")


def grid_dir(reports: str | Path, experiment: str, seed: int) -> Path:
    return Path(reports) / f"{experiment}-s{seed}"


def history(run: RunDir) -> list[dict[str, Any]]:
    return [run.metrics(k) for k in run.completed()]


def export_run(run: RunDir, out: Path, info: dict[str, Any]) -> dict[str, Any]:
    """``train.json`` and ``history.json`` of a finished grid run."""
    hist = history(run)
    init = run.root / EVAL_INIT
    out.mkdir(parents=True, exist_ok=True)  # dvc repro removes a stage's outputs (and their folder) first
    summary = {**info, "run_dir": str(run.root), "iterations": len(hist), **(hist[-1] if hist else {})}
    write_json(out / "train.json", summary)
    write_json(out / "history.json", {"eval_init": json.loads(init.read_text()) if init.is_file() else None,
                                      "iterations": hist})
    return summary


def _val_success(m: dict[str, Any]) -> float:
    vals = [v for k, v in m.items() if k.startswith("val/") and k.endswith("/success") and k.count("/") == 2
            and not k.startswith("val/all/")]
    return sum(vals) / len(vals) if vals else float("nan")


def curve_rows(name: str, hist: Sequence[dict[str, Any]], init: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Rows for dvc plots: step 0 is the evaluation before training (where one ran), step k + 1 after iteration
    k; validation values only on evaluated iterations (empty elsewhere)."""
    nan = float("nan")
    rows = []
    if init:
        rows.append({"run": name, "step": 0, "val_success": _val_success(init),
                     "val_score": init.get("val/score", nan)})
    for k, m in enumerate(hist):
        train = [v for key, v in m.items() if key.startswith("train/") and key.endswith("/success")
                 and key.count("/") == 2]
        rows.append({"run": name, "step": k + 1, "val_success": _val_success(m), "val_score": m.get("val/score", nan),
                     "train_success": sum(train) / len(train) if train else nan,
                     "in_group_std": m.get("rollout/in_group_std", nan), "entropy": m.get("actor/entropy_loss", nan),
                     "grad_norm": m.get("actor/grad_norm", nan), "echo_warning": m.get("echo/warning", nan)})
    return rows


def write_curves(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """A long-format CSV (run, step, metrics); NaN cells are left empty so plots skip them."""
    return write_csv(rows, ["run", "step", *CURVES], path)


def load_results(reports: str | Path, runs: Sequence[tuple[str, int]]) -> tuple[list[GridResult], list[str]]:
    """The scored grid runs (and a note for each listed run with no evaluation yet)."""
    out, missing = [], []
    for name, seed in runs:
        d = grid_dir(reports, name, seed)
        ev = d / "eval" / "eval.json"
        if not ev.is_file():
            missing.append(f"{name}-s{seed}")
            continue
        h = json.loads((d / "history.json").read_text()) if (d / "history.json").is_file() else {"iterations": []}
        out.append(GridResult(name, seed, json.loads(ev.read_text())["metrics"], h["iterations"],
                              h.get("eval_init") or {}))
    return out, missing
