"""One rollout collection from a config: instances -> multi-turn rollout -> rollouts table + metrics."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ragen.agent.chat import ChatRenderer
from ragen.config import Config
from ragen.envs.instances import generate_instances
from ragen.rollout.engine import Engine
from ragen.rollout.episodes import RolloutResult, play_episodes, sampling_for
from ragen.rollout.metrics import env_metrics
from ragen.rollout.table import rollouts_frame


def instances_for(cfg: Config, mode: str, iteration: int = 0) -> pd.DataFrame:
    """The env instances of one iteration (train) or of the fixed validation set (val)."""
    if mode not in ("train", "val"):
        raise ValueError(f"mode must be 'train' or 'val', got {mode!r}")
    split, seed = cfg.envs.for_mode(mode)
    return generate_instances(split.tags, split.n_groups, split.group_size, seed=seed, iteration=iteration,
                              mode=mode, group_rng=cfg.envs.group_rng, tag_specs=cfg.tag_specs(),  # type: ignore[arg-type]
                              seed_cycle=cfg.envs.train_seeds if mode == "train" else None)


@dataclass
class Collection:
    rollouts: pd.DataFrame
    metrics: dict[str, float]
    result: RolloutResult


def interactive() -> bool:
    """Progress bars only on a terminal, never in CI."""
    return sys.stderr.isatty() and not os.environ.get("CI")


class TurnBar:
    """tqdm bar over trajectories finished, with the turn in its postfix."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="traj", disable=not enabled, leave=False)

    def __call__(self, turn: int, finished: int, total: int) -> None:
        self.bar.set_postfix(turn=turn)
        self.bar.update(finished - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def collect(cfg: Config, engine: Engine, renderer: ChatRenderer, *, mode: str = "train", iteration: int = 0,
            instances: pd.DataFrame | None = None, sampling: Any = None, progress: bool | None = None) -> Collection:
    inst = instances if instances is not None else instances_for(cfg, mode, iteration)
    bar = TurnBar(len(inst), f"rollout {mode} iter {iteration}",
                  cfg.rollout.progress and (interactive() if progress is None else progress))
    try:
        res = play_episodes(engine, inst, cfg.agent, renderer, sampling or sampling_for(cfg.rollout, mode),
                               max_model_len=cfg.rollout.max_model_len, run_seed=cfg.trainer.seed,
                               iteration=iteration, mode=mode, tag_specs=cfg.tag_specs(), progress=bar)
    finally:
        bar.close()
    df = rollouts_frame(inst, res.trajectories)
    metrics = env_metrics(df)
    metrics.update(throughput_metrics(res))
    return Collection(df, metrics, res)


def throughput_metrics(res: RolloutResult) -> dict[str, float]:
    total = sum(res.timings.values()) or float("nan")
    gen = res.timings.get("generate", 0.0)
    out = {f"timing_s/rollout_{k}": v for k, v in res.timings.items()}
    out.update({"timing_s/rollout": total, "rollout/generated_tokens": float(res.generated_tokens),
                "rollout/tokens_per_s": res.generated_tokens / gen if gen else 0.0,
                "rollout/env_steps": float(res.env_steps), "rollout/generation_calls": float(res.generation_calls),
                "rollout/empty_generations": float(res.empty_generations)})
    return out
