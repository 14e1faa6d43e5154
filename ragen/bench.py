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


def _length_mix_rollouts(cfg, tokenizer, renderer, seed: int):
    """A fixed batch with a realistic length mix: single-turn Bandit and up-to-5-turn SimpleSokoban episodes,
    replies of 8..cap tokens (Bandit answers are valid arms, so those episodes end after one turn)."""
    import numpy as np

    from ragen.rollout.runner import collect
    from ragen.rollout.scripted import ScriptedEngine

    rng = np.random.default_rng(seed)
    words = ["left", "box", "wall", "push", "the", "target", "so", "then", "up", "I", "should", "move"]
    cap = cfg.rollout.response_length

    def reply(call: int, prompt) -> str:
        n = int(rng.integers(8, cap))
        think = " ".join(rng.choice(words, size=n // 2))
        text = tokenizer.decode(list(prompt[-400:]))
        if "arm" in text.lower() and "Sokoban" not in text:
            move = ["phoenix", "dragon"][int(rng.integers(0, 2))]
        else:
            move = ["Up", "Down", "Left", "Right", "Jump"][int(rng.integers(0, 5))]
        return f"<think>{think}</think><answer>{move}</answer>"

    return collect(cfg, ScriptedEngine(tokenizer, reply), renderer, progress=False).rollouts


def bench_train(*, model: str = "smollm2-135m-instruct", groups: int = 2, group_size: int = 4,
                token_budget: int = 4096, micro_batch_size: int = 2, seed: int = 0,
                bf16: bool | None = None) -> dict[str, float | str]:
    """One StarPO update (GRPO, so the actor alone; same batch, same math) three ways: DeepSpeed ZeRO-0 with
    length-bucketed micro-batches, a plain torch AdamW loop with the same micro-batches, and DeepSpeed with
    fixed micro-batches all padded to the batch's longest (the original's layout). Tokens/s counts real tokens
    (old-logprob pass + training pass) over the update's wall time. ``bf16`` also times bf16 autocast (default:
    only where the hardware multiplies bf16 natively; emulated on an AVX2 CPU it ran 16x slower than fp32)."""
    import torch

    from ragen.agent.chat import ChatRenderer
    from ragen.config import load_config
    from ragen.models import ensure_model, load_tokenizer
    from ragen.models.precision import hardware, native_bf16
    from ragen.train.batch import sequences_from_rollouts
    from ragen.train.ds import make_engine
    from ragen.train.models import load_actor
    from ragen.train.plain import PlainEngine
    from ragen.train.update import update

    cfg = load_config(None, ["cpu-small", "grpo"], [
        f"model.base={model}", "envs.train.tags=[Bandit,SimpleSokoban]", f"envs.train.n_groups=[{groups},{groups}]",
        f"envs.train.group_size={group_size}",
        "algorithm.filter_ratio=1.0", f"actor.ppo_mini_batch_size={2 * groups * group_size}",
        f"actor.micro_batch_size={micro_batch_size}", f"critic.ppo_mini_batch_size={groups * group_size}",
        "actor.gradient_checkpointing=false", f"trainer.seed={seed}"])
    tok = load_tokenizer(cfg.model.base, cfg.model.tokenizer)
    renderer = ChatRenderer(tok, cfg.model.end_of_turn_token)
    seqs = sequences_from_rollouts(_length_mix_rollouts(cfg, tok, renderer, seed))
    lengths = seqs.lengths
    path = ensure_model(model)
    o = cfg.actor
    out: dict[str, float | str] = {"model": model, "trajectories": len(seqs), "tokens": int(lengths.sum()),
                                   "min_len": int(lengths.min()), "max_len": int(lengths.max()),
                                   "token_budget": token_budget, "micro_batch_size": micro_batch_size,
                                   "hardware": hardware()}

    def run(name: str, engine_kind: str, bucketed: bool, compute_dtype: str = "fp32") -> None:
        torch.manual_seed(seed)
        actor = load_actor(path)
        if engine_kind == "deepspeed":
            engine = make_engine(actor, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, grad_clip=o.grad_clip,
                                 ds_config="infra/deepspeed/zero0.json", dtype="fp32")
        else:
            engine = PlainEngine(actor, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, grad_clip=o.grad_clip)
        c = cfg.model_copy(update={"actor": o.model_copy(update={"micro_batch_tokens": token_budget if bucketed
                                                                 else 0, "compute_dtype": compute_dtype}),
                                   "model": cfg.model.model_copy(update={"emulated_bf16": "keep"})})  # bf16 as asked
        t0 = time.perf_counter()
        res = update(c, seqs, engine, pad_id=tok.pad_token_id, pad_to_longest=not bucketed)
        wall = time.perf_counter() - t0
        out[f"{name}_s"] = wall
        out[f"{name}_tokens_per_s"] = 2 * float(lengths.sum()) / wall
        out[f"{name}_pg_loss"] = res.metrics["actor/pg_loss"]

    run("deepspeed_bucketed", "deepspeed", True)
    run("plain_bucketed", "plain", True)
    run("deepspeed_padded", "deepspeed", False)
    if (native_bf16() if bf16 is None else bf16):
        run("deepspeed_bucketed_bf16", "deepspeed", True, "bf16")  # bf16 autocast, fp32 weights and optimizer
        out["bf16_over_fp32"] = float(out["deepspeed_bucketed_bf16_tokens_per_s"]) / float(
            out["deepspeed_bucketed_tokens_per_s"])
    out["deepspeed_over_plain"] = float(out["deepspeed_bucketed_tokens_per_s"]) / float(
        out["plain_bucketed_tokens_per_s"])
    out["bucketed_over_padded"] = float(out["deepspeed_bucketed_tokens_per_s"]) / float(
        out["deepspeed_padded_tokens_per_s"])
    return out


def bench_faults(*, quick: bool = False, pytest_args: tuple[str, ...] = ()) -> dict:
    """Run the fault-injection suite (tests/faults of the project checkout) and return its counts: faults tried,
    survived, files of completed iterations guarded and lost. ``quick`` leaves out the cases that train (slow)."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    suite = Path(__file__).resolve().parents[1] / "tests" / "faults"
    if not suite.is_dir():
        raise FileNotFoundError(f"{suite} not found: `ragen bench faults` runs the project's test suite, so it "
                                f"needs a source checkout (git clone), not an installed wheel")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "faults.json"
        env = dict(os.environ, RAGEN_FAULTS_JSON=str(out))
        cmd = [sys.executable, "-m", "pytest", str(suite), "-q", "-p", "no:cacheprovider",
               *(["-m", "not slow"] if quick else []), *pytest_args]
        t0 = time.monotonic()
        # pytest's own report goes to stderr, so stdout stays one JSON object
        r = subprocess.run(cmd, cwd=suite.parents[1], env=env, stdout=sys.stderr, stderr=sys.stderr)
        counts = json.loads(out.read_text()) if out.is_file() else {"faults_tried": 0, "survived": 0,
                                                                     "data_lost": 0, "faults": []}
    return {**counts, "pytest_exit_code": r.returncode, "wall_s": round(time.monotonic() - t0, 1),
            "quick": quick}
