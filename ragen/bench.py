"""Speed checks (benchmarks, not tests). Each returns a flat dict that the CLI prints as JSON."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ragen.envs import get_tag
from ragen.envs.sokoban import generate_room


def _rate(fn: Callable[[int], None], seconds: float, min_iters: int = 20) -> float:
    """Calls per second of ``fn(i)`` over at least ``seconds`` (and ``min_iters`` calls)."""
    n, start = 0, time.perf_counter()
    while True:
        fn(n)
        n += 1
        elapsed = time.perf_counter() - start
        if n >= min_iters and elapsed >= seconds:
            return n / elapsed


def bench_envs(seconds: float = 2.0, seed: int = 0) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, tag in (("sokoban_rooms_per_s", "SimpleSokoban"), ("larger_sokoban_rooms_per_s", "LargerSokoban")):
        kw = get_tag(tag).env_kwargs
        rng = np.random.default_rng(seed)
        out[key] = _rate(lambda _i, kw=kw, rng=rng: generate_room(kw["dim"], kw["num_boxes"],
                                                                  kw["search_depth"], rng), seconds)
    for key, tag in (("sokoban_steps_per_s", "SimpleSokoban"), ("frozen_lake_steps_per_s", "FrozenLake")):
        env = get_tag(tag).make()
        rng = np.random.default_rng(seed)
        actions = rng.integers(1, 5, size=1 << 16)
        env.reset(seed=seed)

        def step(i: int, env=env, actions=actions) -> None:
            _, _, term, trunc, _ = env.step(int(actions[i & 0xFFFF]))
            if term or trunc:
                env.reset(seed=seed + i)

        out[key] = _rate(step, seconds)
    # steps include the resets they trigger; the mean over both multi-turn envs is the headline figure
    out["env_steps_per_s"] = (out["sokoban_steps_per_s"] + out["frozen_lake_steps_per_s"]) / 2
    return {k: round(v, 1) for k, v in out.items()}
