"""The multi-turn rollout loop (docs/rollout.md): one batched generation call per turn for every still-active
trajectory, then parse, step and advance each; stop when all are done. Returns finished trajectories and where
the time went (generation vs env stepping vs prompt rendering / assembly)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ragen.agent.chat import ChatRenderer
from ragen.agent.episode import Episode, Trajectory
from ragen.config import AgentConfig
from ragen.envs.registry import TagSpec, get_tag
from ragen.rollout.engine import Engine, Sampling

MODE_CODE = {"train": 0, "val": 1}


def call_seed(run_seed: int, iteration: int, mode: str, turn: int) -> int:
    """Seed of one generation call, from (run seed, iteration, mode, turn): a resumed run samples as an
    uninterrupted one would."""
    return int(np.random.SeedSequence([run_seed, iteration, MODE_CODE[mode], turn]).generate_state(1)[0])


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    timings: dict[str, float] = field(default_factory=dict)
    generated_tokens: int = 0
    env_steps: int = 0
    generation_calls: int = 0
    empty_generations: int = 0


class _Timer:
    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def add(self, key: str, t0: float) -> float:
        now = time.perf_counter()
        self.totals[key] = self.totals.get(key, 0.0) + now - t0
        return now


def play_episodes(engine: Engine, instances: pd.DataFrame, agent: AgentConfig, renderer: ChatRenderer,
                     sampling: Sampling, *, max_model_len: int, run_seed: int, iteration: int = 0,
                     mode: str = "train", tag_specs: Mapping[str, TagSpec] | None = None,
                     progress: Callable[[int, int, int], None] | None = None) -> RolloutResult:
    """Roll out every row of an instances table. ``progress(turn, finished, total)`` is called after each turn."""
    if instances.empty:
        raise ValueError("the instances table is empty: nothing to roll out")
    timer = _Timer()
    t = time.perf_counter()
    stop = tuple(sorted({*sampling.stop_token_ids, renderer.end_of_turn_id}))
    sampling = Sampling(sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens, stop)
    episodes = []
    for row in instances.itertuples(index=False):
        spec = get_tag(row.tag, tag_specs)
        stream = None if pd.isna(row.stream) else int(row.stream)
        ep = Episode(spec.make(), spec, agent, renderer, seed=int(row.seed), stream=stream)
        expected = getattr(row, "initial_state", "")
        if expected and ep.history[0].state != expected:  # the table and the envs must agree on the task
            raise ValueError(f"env {row.env_id} ({row.tag}, seed {row.seed}) resets to a different state than "
                             f"its instances row records; regenerate the instances with this code version")
        episodes.append(ep)
    t = timer.add("env", t)
    result = RolloutResult([])
    for turn in range(agent.max_turn):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        prompts, batch = [], []
        for e in active:
            ids = e.prompt_ids()
            room = max_model_len - len(ids)
            if room < 1:
                e.stop_for_context()
                continue
            prompts.append(ids)
            batch.append((e, min(room, sampling.max_new_tokens)))
        t = timer.add("render", t)
        if not batch:
            break
        gens = engine.generate(prompts, sampling, seed=call_seed(run_seed, iteration, mode, turn),
                               max_new_tokens=[cap for _, cap in batch])
        t = timer.add("generate", t)
        if len(gens) != len(batch):
            raise RuntimeError(f"the {engine.name} engine returned {len(gens)} generations for {len(batch)} prompts")
        result.generation_calls += 1
        for (e, cap), g in zip(batch, gens, strict=True):
            ids, lps = list(g.token_ids)[:cap], list(g.logprobs)[:cap]
            if not ids:  # a real engine always yields a token; treat nothing as an immediate end of turn
                ids, lps = [renderer.end_of_turn_id], [math.nan]
                result.empty_generations += 1
            result.generated_tokens += len(ids)
            before = e.num_actions
            e.record(ids, lps if len(lps) == len(ids) else None, finish_reason=g.finish_reason)
            result.env_steps += e.num_actions - before
        t = timer.add("env", t)
        if progress is not None:
            progress(turn + 1, sum(e.done for e in episodes), len(episodes))
    result.trajectories = [e.assemble() for e in episodes]
    timer.add("assemble", t)
    result.timings = timer.totals
    return result


def sampling_for(rollout: Any, mode: str) -> Sampling:
    """Generation settings of a reset mode from ``RolloutConfig`` (docs/rollout.md): train samples at
    ``temperature``; val at ``val_temperature`` (0 or ``val_do_sample`` False = greedy)."""
    val_temp = rollout.val_temperature if rollout.val_do_sample else 0.0
    temp = rollout.temperature if mode == "train" else val_temp
    return Sampling(temperature=temp, top_p=rollout.top_p, top_k=rollout.top_k,
                    max_new_tokens=rollout.response_length)
