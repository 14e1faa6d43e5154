"""Format evaluation of a model with thinking on: fixed seeds per tag (``sft.eval_n`` from ``sft.eval_seed``),
rolled out with the demo agent settings; the share of turns whose answer is well formed (think + answer, only
known actions), success, and for Bandit which arm the valid answers chose (a warm-start must not leak it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ragen.config import Config
from ragen.envs.instances import generate_instances
from ragen.rollout.engine import Engine, Sampling
from ragen.sft.demos import sft_config


def eval_config(cfg: Config) -> Config:
    """The run's config as the demos see it (``sft_config``) with the evaluation's sampling."""
    s = cfg.sft
    rollout = cfg.rollout.model_copy(update={"response_length": s.response_length,
                                             "val_temperature": s.eval_temperature,
                                             "val_do_sample": s.eval_temperature > 0})
    return sft_config(cfg).model_copy(update={"rollout": rollout})


def eval_instances(cfg: Config) -> pd.DataFrame:
    s = cfg.sft
    return generate_instances(s.tags, [s.eval_n] * len(s.tags), 1, seed=s.eval_seed, iteration=0, mode="val",
                              tag_specs=sft_config(cfg).tag_specs())


def format_metrics(df: pd.DataFrame, cfg: Config) -> dict[str, float]:
    """Per tag: format_valid (turn share), episode_format_valid (every turn valid), success, response_length;
    Bandit-type tags also hi_arm_share (of valid answers naming the high-risk arm) and first_arm_share."""
    specs = sft_config(cfg).tag_specs()
    out: dict[str, float] = {}
    for tag, sub in df.groupby("tag", sort=True):
        errs = [np.asarray(x, dtype=bool) for x in sub["turn_format_error"]]
        turns = np.concatenate(errs) if errs else np.zeros(0, dtype=bool)
        out[f"{tag}/format_valid"] = float(1 - turns.mean()) if len(turns) else 0.0
        out[f"{tag}/episode_format_valid"] = float(np.mean([not e.any() for e in errs]))
        out[f"{tag}/success"] = float(sub["success"].mean())
        out[f"{tag}/response_length"] = float(sub["response_length"].mean())
        out[f"{tag}/episodes"] = float(len(sub))
        spec = specs[tag]
        if spec.env_type == "bandit":
            hi = spec.env_kwargs.get("hi_arm_name", "Dragon")
            chosen = [acts[0][0] for acts, err in zip(sub["turn_actions"], errs, strict=True)
                      if len(acts) and len(acts[0]) and not err[0]]
            out[f"{tag}/valid_answers"] = float(len(chosen))
            out[f"{tag}/hi_arm_share"] = float(np.mean([c == hi for c in chosen])) if chosen else float("nan")
    valid = [out[f"{t}/format_valid"] for t in sorted(df["tag"].unique())]
    out["format_valid_mean"] = float(np.mean(valid))
    out["format_valid_min"] = float(np.min(valid))
    return out


def evaluate_format(cfg: Config, engine: Engine, renderer: Any) -> tuple[pd.DataFrame, dict[str, float]]:
    from ragen.rollout.episodes import sampling_for
    from ragen.rollout.runner import collect

    ecfg = eval_config(cfg)
    sampling: Sampling = sampling_for(ecfg.rollout, "val")
    c = collect(ecfg, engine, renderer, mode="val", instances=eval_instances(cfg), sampling=sampling)
    metrics = format_metrics(c.rollouts, cfg)
    metrics["timing_s/eval"] = c.metrics.get("timing_s/rollout", float("nan"))
    metrics["rollout/tokens_per_s"] = c.metrics.get("rollout/tokens_per_s", float("nan"))
    return c.rollouts, metrics
