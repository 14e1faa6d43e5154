"""The SFT warm-start as stages over files: demos (parquet) -> format evaluation of the base model -> SFT
(checkpoint) -> format evaluation of the result. ``tasks/sft.py`` wraps each stage as a Prefect task and
``flows/sft.py`` chains them; ``run_sft`` chains them without an orchestrator. Also how an RL run finds its
warm-start checkpoint (``model.warm_start``)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from ragen.config import Config, config_to_dict, flatten
from ragen.io import write_json
from ragen.train.checkpoint import is_complete, model_dir

EVAL_FILES = {"before": "eval_before.json", "after": "eval_after.json"}
HISTORY = "history.jsonl"


def fingerprint(cfg: Config) -> str:
    """What an SFT checkpoint is made from: the base model, the SFT settings, and the agent / rollout settings
    the demos are rendered with. A warm-start whose checkpoint has another fingerprint is stale."""
    from ragen.sft.demos import demo_agent, demo_custom

    d = config_to_dict(cfg)
    keep = {"model.base": d["model"]["base"], "model.tokenizer": d["model"]["tokenizer"],
            "model.end_of_turn_token": d["model"]["end_of_turn_token"],
            "rollout.max_model_len": d["rollout"]["max_model_len"],
            **{k: v for k, v in flatten(demo_agent(cfg).model_dump(mode="json"), "agent.").items()
               if k not in ("agent.format_penalty", "agent.use_turn_scores")},  # rewards only, not the tokens
            **flatten(d["sft"], "sft."),
            "envs.custom": demo_custom(cfg)}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def max_turn_tokens(df: Any) -> int:
    """The longest demo turn in sampled tokens (end-of-turn included): RL must allow that many per turn."""
    import numpy as np

    longest = 0
    for mask, ends in zip(df["loss_mask"], df["turn_end_positions"], strict=True):
        m = np.asarray(mask, dtype=bool)
        start = 0
        for e in ends:
            longest = max(longest, int(m[start:e + 1].sum()))
            start = e + 1
    return longest


def _record(path: Path) -> dict[str, Any]:
    f = path / "sft.json"
    return json.loads(f.read_text()) if f.is_file() else {}


# -- warm-start resolution for RL ------------------------------------------------------------------------------
def uses_warm_start(cfg: Config) -> bool:
    ws = cfg.model.warm_start
    return ws != "off" and not (ws == "auto" and not cfg.agent.enable_think)


def checkpoint_ready(cfg: Config) -> bool:
    """The ``auto`` checkpoint exists, is complete and was made from these settings."""
    out = Path(cfg.sft.output)
    return is_complete(out) and _record(out).get("fingerprint") == fingerprint(cfg)


def needs_build(cfg: Config) -> bool:
    return cfg.model.warm_start == "auto" and uses_warm_start(cfg) and not checkpoint_ready(cfg)


def warm_start_path(cfg: Config) -> str | None:
    """The model path RL starts from instead of ``model.base`` (None: no warm-start)."""
    if not uses_warm_start(cfg):
        return None
    ws = cfg.model.warm_start
    if ws == "auto":
        if not checkpoint_ready(cfg):
            raise FileNotFoundError(f"model.warm_start=auto: no SFT checkpoint made from these settings at "
                                    f"{cfg.sft.output} (missing, incomplete or stale); make it with `ragen sft` "
                                    f"(or `dvc repro sft`), or set model.warm_start=off")
        need = int(_record(Path(cfg.sft.output)).get("max_turn_tokens", 0))
        if cfg.rollout.response_length < need:
            raise ValueError(f"rollout.response_length={cfg.rollout.response_length} cuts the warm-start's answers "
                             f"(its demo turns take up to {need} tokens, think included): raise "
                             f"rollout.response_length to at least {need}")
        return str(Path(cfg.sft.output) / "actor")
    actor = model_dir(ws)
    if actor is None:
        raise FileNotFoundError(f"model.warm_start={ws!r}: neither {ws}/actor nor {ws} is a model directory with "
                                f"config.json; point it at an SFT checkpoint (made by `ragen sft`)")
    return str(actor)


def check_buildable_here() -> None:
    """The warm start trains in one process: under a launcher the other ranks wait in the RL trainer's calls."""
    from ragen.train.ranks import LaunchError, launched

    if launched():
        raise LaunchError("model.warm_start=auto: the SFT checkpoint is missing or stale, and a launched run "
                          "(WORLD_SIZE > 1) cannot make it; make it first in one process (`ragen sft train` with "
                          "the same --params/--preset/--set), then launch again")


def ensure_warm_start(cfg: Config) -> str | None:
    """``warm_start_path``, making the ``auto`` checkpoint first (plain stages) when it is missing or stale."""
    if needs_build(cfg):
        check_buildable_here()
        run_sft(cfg, evaluate=False)  # RL's own validation follows; `ragen sft train` measures the format
    return warm_start_path(cfg)


# -- stages ------------------------------------------------------------------------------------------------------
def _renderer(cfg: Config) -> Any:
    from ragen.rollout.factory import make_renderer

    return make_renderer(cfg)


def make_demos_stage(cfg: Config, out: str | Path | None = None, *, progress: bool = False) -> Path:
    """Write the demonstrations table (train and test splits), reusing it when made from the same settings."""
    from ragen.sft.demos import make_demos, read_demos, write_demos

    path = Path(out or cfg.sft.demos)
    meta = path.with_suffix(".json")
    fp = fingerprint(cfg)
    if path.is_file() and meta.is_file() and json.loads(meta.read_text()).get("fingerprint") == fp:
        read_demos(path)  # a damaged file is an error here, not at training
        return path
    bar = _bar(progress, "demos")
    df = make_demos(cfg, _renderer(cfg), progress=bar)
    write_demos(df, path)
    summary = {"fingerprint": fp, "rows": len(df),
               "per_tag": {f"{split}/{tag}": int(n) for (split, tag), n in df.groupby(["split", "tag"]).size().items()},
               "success": {tag: float(v) for tag, v in df.groupby("tag")["success"].mean().items()},
               "mean_length": float(df["length"].mean()), "max_turn_tokens": max_turn_tokens(df)}
    meta.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path


def _bar(enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    bars: dict[str, Any] = {}

    def update(key: str, done: int, total: int) -> None:
        if key not in bars:
            bars[key] = tqdm(total=total, desc=f"{desc} {key}", leave=False)
        bars[key].update(done - bars[key].n)
        if done >= total:
            bars[key].close()

    return update


def evaluate_stage(cfg: Config, model_path: str | None, out: str | Path) -> dict[str, float]:
    """Format evaluation of ``model_path`` (default: ``model.base``) on the fixed seeds; JSON to ``out``."""
    from ragen.io import write_json
    from ragen.rollout.factory import make_engine
    from ragen.rollout.table import write_rollouts
    from ragen.sft.evaluate import evaluate_format

    renderer = _renderer(cfg)
    engine = make_engine(cfg, renderer.tokenizer, model_path=model_path)
    try:
        rollouts, metrics = evaluate_format(cfg, engine, renderer)
    finally:
        engine.close()
    metrics["model"] = model_path or cfg.model.base  # type: ignore[assignment]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_rollouts(rollouts, out.with_suffix(".parquet"))  # the episodes behind the numbers, for inspection
    write_json(out, metrics)
    return metrics


def train_stage(cfg: Config, demos: str | Path, out: str | Path | None = None, *, progress: bool = False
                ) -> tuple[Path, dict[str, float]]:
    """SFT on the train split (test loss on the test split); the checkpoint goes to ``out`` (sft.output)."""
    from ragen.sft.demos import read_demos
    from ragen.sft.train import SFTTrainer

    out = Path(out or cfg.sft.output)
    df = read_demos(demos)
    train, test = df[df["split"] == "train"], df[df["split"] == "test"]
    if train.empty:
        raise ValueError(f"demonstrations file {demos} has no train split; make it again with `ragen sft demos`")
    trainer = SFTTrainer(cfg)
    history: list[dict[str, float]] = []
    total = cfg.sft.epochs * -(-len(train) // cfg.sft.mini_batch_size)
    bar = None
    if progress and sys.stderr.isatty():
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="sft", unit="step", leave=False)
    every = max(1, total // 20)  # off a terminal (a log file, Prefect, CI): one line per ~5% of the steps
    t0 = time.monotonic()

    progress_at = progress_file(out)

    def on_step(rec: dict[str, float]) -> None:
        history.append(rec)
        if bar is not None:
            bar.set_postfix(loss=f"{rec['loss']:.3f}")
            bar.update(1)
        elif len(history) % every == 0 or len(history) == total:
            print(f"sft step {len(history)}/{total}: loss {rec['loss']:.3f}, {time.monotonic() - t0:.0f} s",
                  file=sys.stderr, flush=True)
        # for a watcher in another process (`ragen up` while the worker trains the warm-start)
        write_json(progress_at, {"step": len(history), "total": total, "loss": rec["loss"],
                                 "elapsed_s": time.monotonic() - t0})

    test_loss_before = trainer.evaluate_loss(test) if not test.empty else float("nan")
    res = trainer.train(train, test=test if not test.empty else None, on_step=on_step)
    if bar is not None:
        bar.close()
    res.metrics["sft/test_loss_before"] = test_loss_before
    record = {"fingerprint": fingerprint(cfg), "base": trainer.base, "metrics": res.metrics,
              "max_turn_tokens": max_turn_tokens(train),
              "demos": str(demos), "lora_rank": cfg.sft.lora_rank, "time": time.time(),
              "config": config_to_dict(cfg)["sft"]}
    path = trainer.save(out, record)
    (path / HISTORY).write_text("".join(json.dumps(r) + "\n" for r in history))
    progress_at.unlink(missing_ok=True)
    return path, res.metrics


def progress_file(out: str | Path) -> Path:
    """Where the SFT stage keeps its latest step while it trains (beside the checkpoint folder, which only ever
    appears complete): step, total, loss, seconds so far."""
    out = Path(out)
    return out.with_name(out.name + ".progress.json")


def progress_line(progress: dict[str, float]) -> str:
    """``warm-start (SFT) step 12/48: loss 0.171, 297 s, about 15 min left``."""
    step, total, elapsed = int(progress["step"]), int(progress["total"]), float(progress["elapsed_s"])
    left = elapsed / step * (total - step) if step else float("nan")
    when = "" if step >= total or left != left else \
        f", about {left / 60:.0f} min left" if left >= 180 else f", about {left:.0f} s left"
    return f"warm-start (SFT) step {step}/{total}: loss {progress['loss']:.3f}, {elapsed:.0f} s{when}"


class SftStages(Protocol):
    """The three stages ``run_sft`` chains: plain calls (``PlainStages``) or Prefect tasks (the module
    ``tasks.sft``)."""

    def make_demos(self, cfg: Config) -> Path: ...

    def evaluate_format(self, cfg: Config, model_path: str | None, out: str | Path) -> dict[str, float]: ...

    def train_sft(self, cfg: Config, demos: str | Path) -> tuple[Path, dict[str, float]]: ...


class PlainStages:
    """The stages as plain calls; ``tasks.sft`` has the same names as Prefect tasks."""

    make_demos = staticmethod(lambda cfg: make_demos_stage(cfg))
    evaluate_format = staticmethod(evaluate_stage)
    train_sft = staticmethod(lambda cfg, demos: train_stage(cfg, demos))


def run_sft(cfg: Config, *, ops: SftStages = PlainStages, evaluate: bool = True) -> dict[str, Any]:
    """The chain: demos -> (format of the base model) -> SFT -> (format of the checkpoint); returns every
    stage's metrics. The base model's evaluation is written beside the output first and moved into the
    checkpoint once it exists (the checkpoint directory only ever appears complete)."""
    out = Path(cfg.sft.output)
    demos = ops.make_demos(cfg)
    result: dict[str, Any] = {"demos": str(demos), "output": str(out)}
    staging = out.with_name(out.name + ".eval")
    if evaluate:
        result["before"] = ops.evaluate_format(cfg, None, staging / EVAL_FILES["before"])
    path, result["train"] = ops.train_sft(cfg, demos)
    if evaluate:
        for suffix in (".json", ".parquet"):
            name = Path(EVAL_FILES["before"]).with_suffix(suffix).name
            shutil.copy(staging / name, path / name)
        shutil.rmtree(staging, ignore_errors=True)
        result["after"] = ops.evaluate_format(cfg, str(path / "actor"), path / EVAL_FILES["after"])
    result["checkpoint"] = str(path)
    return result
