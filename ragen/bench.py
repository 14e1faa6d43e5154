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


def bench_rollout(engines: tuple[str, ...] = ("vllm", "hf"), *, model: str = "smollm2-135m-instruct",
                  tag: str = "SimpleSokoban", groups: int = 8, group_size: int = 8, turns: int = 5,
                  new_tokens: int = 128, seed: int = 0, extra: tuple[str, ...] = ()) -> dict[str, float | str]:
    """The same multi-turn workload through each engine in one process: generated tokens/s, env steps/s and
    the share of rollout wall time spent outside generation (rendering prompts, env steps, assembly)."""
    import gc

    from ragen.agent.chat import ChatRenderer
    from ragen.config import load_config
    from ragen.models import load_tokenizer
    from ragen.models.precision import model_dtype
    from ragen.rollout.factory import make_engine
    from ragen.rollout.runner import collect

    overrides = [f"model.base={model}", f"envs.train.tags=[{tag}]", f"envs.train.n_groups=[{groups}]",
                 f"envs.train.group_size={group_size}", f"agent.max_turn={turns}",
                 f"rollout.response_length={new_tokens}", f"trainer.seed={seed}", *extra]
    cfg = load_config(None, ["cpu-small"], overrides)
    tok = load_tokenizer(cfg.model.base, cfg.model.tokenizer)
    renderer = ChatRenderer(tok, cfg.model.end_of_turn_token)
    out: dict[str, float | str] = {"model": model, "tag": tag, "trajectories": groups * group_size, "turns": turns,
                                   "new_tokens_per_turn": new_tokens, "dtype": model_dtype(cfg),
                                   "overrides": " ".join(extra)}
    for name in engines:
        t0 = time.perf_counter()
        engine = make_engine(cfg, tok, engine=name)
        out[f"{name}_init_s"] = time.perf_counter() - t0
        c = collect(cfg, engine, renderer, progress=False)
        engine.close()
        del engine
        gc.collect()
        tm = c.result.timings
        wall = sum(tm.values())
        out[f"{name}_tokens_per_s"] = c.result.generated_tokens / tm["generate"]
        out[f"{name}_generated_tokens"] = c.result.generated_tokens
        out[f"{name}_rollout_s"] = wall
        out[f"{name}_env_steps_per_s"] = c.result.env_steps / wall
        out[f"{name}_generation_share"] = tm["generate"] / wall
        out[f"{name}_env_share"] = tm.get("env", 0.0) / wall
        out[f"{name}_assembly_share"] = (tm.get("render", 0.0) + tm.get("assemble", 0.0)) / wall
        out[f"{name}_overhead_share"] = 1.0 - tm["generate"] / wall
    if "vllm" in engines and "hf" in engines:
        out["vllm_over_hf"] = float(out["vllm_tokens_per_s"]) / float(out["hf_tokens_per_s"])
    return out
