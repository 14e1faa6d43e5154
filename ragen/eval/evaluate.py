"""Score a model on a panel: the panel's seeds (``eval.pass_k`` samples each) rolled out with the run's agent
settings at the validation sampling (temperature 0.5 as the paper; ``greedy`` for argmax), written as
``eval.json`` (metrics) + ``rollouts.parquet`` (every trajectory) in one directory."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from ragen.config import Config
from ragen.envs.instances import seeded_instances
from ragen.eval.metrics import panel_metrics
from ragen.eval.panels import Panel, read_panel
from ragen.rollout.engine import Engine, Sampling

EVAL_JSON = "eval.json"
ROLLOUTS = "rollouts.parquet"


@dataclass
class EvalResult:
    rollouts: pd.DataFrame
    metrics: dict[str, float]


def load_panel(cfg: Config, tags: list[str] | None = None) -> Panel:
    """``eval.panel`` restricted to ``tags`` (default ``eval.tags``, else the whole panel)."""
    if cfg.eval.panel is None:
        raise ValueError("eval.panel is not set: give a panel file (`ragen eval panel --out FILE` makes one)")
    return read_panel(cfg.eval.panel, known_tags=list(cfg.tag_specs())).select(tags or cfg.eval.tags or None)


def eval_sampling(cfg: Config, greedy: bool = False) -> Sampling:
    from ragen.rollout.loop import sampling_for

    s = sampling_for(cfg.rollout, "val")
    return replace(s, temperature=0.0) if greedy else s


def evaluate_panel(cfg: Config, engine: Engine, renderer: Any, panel: Panel, *, greedy: bool = False,
                   progress: bool | None = None) -> EvalResult:
    from ragen.rollout.runner import collect

    inst = seeded_instances(panel.pairs(), cfg.eval.pass_k, mode="val", group_rng=cfg.envs.group_rng,
                            tag_specs=cfg.tag_specs())  # type: ignore[arg-type]
    t0 = time.monotonic()
    c = collect(cfg, engine, renderer, mode="val", instances=inst, sampling=eval_sampling(cfg, greedy),
                progress=progress)
    metrics = panel_metrics(c.rollouts)
    metrics.update({"timing_s/eval": time.monotonic() - t0, "eval/greedy": float(greedy),
                    "eval/temperature": 0.0 if greedy else eval_sampling(cfg).temperature,
                    "eval/samples_per_seed": float(cfg.eval.pass_k)})
    return EvalResult(c.rollouts, metrics)


def write_eval(res: EvalResult, out: str | Path, info: dict[str, Any] | None = None) -> Path:
    """``out/eval.json`` (metrics + ``info``: what was scored, on which panel) and ``out/rollouts.parquet``."""
    from ragen.rollout.table import write_rollouts
    from ragen.run.rundir import write_json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_rollouts(res.rollouts, out / ROLLOUTS)
    write_json(out / EVAL_JSON, {"metrics": res.metrics, **(info or {})})
    return out / EVAL_JSON


def read_eval(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    p = p / EVAL_JSON if p.is_dir() else p
    if not p.is_file():
        raise FileNotFoundError(f"no evaluation at {p}; run `ragen eval` first")
    return json.loads(p.read_text())


def evaluate_model(cfg: Config, model_path: str | None, out: str | Path, *, greedy: bool = False,
                   tags: list[str] | None = None, info: dict[str, Any] | None = None,
                   progress: bool | None = None) -> dict[str, float]:
    """Score the model at ``model_path`` (a checkpoint's actor/ or any model directory; default ``model.base``) on
    ``eval.panel``; writes ``out/eval.json`` + ``out/rollouts.parquet`` and returns the metrics."""
    from ragen.rollout.factory import make_engine, make_renderer

    panel = load_panel(cfg, tags)
    renderer = make_renderer(cfg)
    engine = make_engine(cfg, renderer.tokenizer, model_path=model_path)
    try:
        res = evaluate_panel(cfg, engine, renderer, panel, greedy=greedy, progress=progress)
    finally:
        engine.close()
    write_eval(res, out, {"model": model_path or cfg.model.base, "panel": str(cfg.eval.panel),
                          "panel_name": panel.name, "tags": panel.tags, "greedy": greedy, **(info or {})})
    return res.metrics


def resolve_checkpoint(path: str | Path, which: str = "last") -> tuple[Path, dict[str, Any]]:
    """The model directory to score for ``path``: a model directory, a checkpoint (its ``actor/``), or a run
    directory (its last retained checkpoint, or with ``which="best"`` the best-scored one: that choice is made on
    the validation seeds, so scoring it on the same panel flatters it); plus what was chosen."""
    from ragen.run.iteration import best_iteration
    from ragen.run.rundir import RunDir
    from ragen.train.checkpoint import model_dir

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
    import shutil

    from ragen.run.iteration import panel_eval_dir
    from ragen.run.rundir import RunDir, write_json

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
