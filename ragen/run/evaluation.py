"""A run directory's checkpoints on the evaluation panel: which checkpoint of a run to score, and reusing the
evaluation a run already made of it (the evaluation itself, ragen/eval, knows nothing of run directories)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ragen.config import Config
from ragen.eval.evaluate import EVAL_JSON, ROLLOUTS, eval_sampling, load_panel, read_eval
from ragen.io import write_json
from ragen.run.iteration import best_iteration, panel_eval_dir
from ragen.run.rundir import RunDir
from ragen.train.checkpoint import model_dir


def resolve_checkpoint(path: str | Path, which: str = "last") -> tuple[Path, dict[str, Any]]:
    """The model directory to score for ``path``: a model directory, a checkpoint (its ``actor/``), or a run
    directory (its last retained checkpoint, or with ``which="best"`` the best-scored one: that choice is made on
    the validation seeds, so scoring it on the same panel flatters it); plus what was chosen."""
    p = Path(path)
    found = model_dir(p)
    if found is not None:
        return found, {"checkpoint": str(p)}
    if not (p / "config.yaml").is_file():
        raise FileNotFoundError(f"{p} is neither a model directory (config.json), a checkpoint (actor/config.json) "
                                f"nor a run directory (config.yaml); give one of those")
    run = RunDir(p)
    done = {k: d for k in run.completed() if (d := model_dir(run.state(k))) is not None}
    if not done:
        raise FileNotFoundError(f"run {p} has no retained checkpoint with an actor/ (trainer.checkpoint_every keeps "
                                f"them); give a checkpoint or model directory")
    best = best_iteration(run) if which == "best" else None
    k = best if best in done else max(done)
    return done[k], {"checkpoint": str(run.state(k)), "run_dir": str(p), "iteration": k}


def reuse_run_evaluation(cfg: Config, run_dir: str | Path, out: str | Path) -> str | None:
    """When the run at ``run_dir`` scored the checkpoint ``resolve_checkpoint`` picks (its last) during training,
    on this ``eval.panel`` with these tags, samples per seed and temperature, copy that evaluation to ``out`` (as
    ``evaluate_model`` writes one) and return where it came from; else None (score it anew). A grid's evaluation
    stage then costs nothing for runs whose final validation already was the panel evaluation."""
    try:
        model, info = resolve_checkpoint(run_dir)
    except FileNotFoundError:
        return None
    k = info.get("iteration")
    if k is None:
        return None
    src = panel_eval_dir(RunDir(Path(run_dir)).iteration(k) / EVAL_JSON)
    if not (src / EVAL_JSON).is_file() or not (src / ROLLOUTS).is_file():
        return None
    data = read_eval(src)
    panel, m = load_panel(cfg), data.get("metrics", {})
    same = (data.get("panel") == str(cfg.eval.panel) and data.get("panel_name") == panel.name
            and list(data.get("tags", [])) == list(panel.tags) and not data.get("greedy")
            and m.get("eval/samples_per_seed") == float(cfg.eval.pass_k)
            and m.get("eval/temperature") == eval_sampling(cfg).temperature)
    if not same:
        return None
    dst = Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / ROLLOUTS, dst / ROLLOUTS)
    write_json(dst / EVAL_JSON, {**data, "model": str(model), **info, "reused_from": str(src)})
    return str(src)
