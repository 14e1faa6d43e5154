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
from ragen.io import write_json
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
    from ragen.rollout.episodes import sampling_for

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
