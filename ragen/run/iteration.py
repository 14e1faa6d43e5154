"""The stages of one training iteration as plain functions over a run directory (docs/design.md). Prefect tasks wrap
them one to one; ``ragen.run.loop.run_training`` chains them without any orchestrator (tests, notebooks, the
pipeline benchmark).

The engines are heavy and stateful, so they live in a ``Runtime`` the caller keeps for the whole run; the stages
pass paths and small records. A stage rewrites its own files from scratch, so re-running an interrupted iteration
gives the same files as an uninterrupted one."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragen.config import Config
from ragen.io import write_json
from ragen.run.retention import prune_states
from ragen.run.rundir import ResumeError, RunDir
from ragen.train.ranks import LaunchError

if TYPE_CHECKING:
    from ragen.agent.chat import ChatRenderer
    from ragen.rollout.engine import Engine
    from ragen.train.trainer import Trainer

EVAL_INIT = "eval_init.json"


@dataclass
class Runtime:
    """What a run holds in its process: tokenizer, renderer, rollout engine and trainer (built by ``open``)."""

    cfg: Config
    resume: Path | None = None
    run: RunDir | None = None  # for error messages about the resume checkpoint
    tokenizer: Any = None  # a transformers tokenizer (of any model class)
    renderer: ChatRenderer | None = None
    engine: Engine | None = None
    trainer: Trainer | None = None

    def open(self) -> Runtime:
        from ragen.rollout.sync import SyncGateError

        try:
            return self._open()
        # a gate failure is the engine's, not the checkpoint's; a launch error is the settings'
        except (ResumeError, MemoryError, SyncGateError, LaunchError):
            raise
        except Exception as e:  # loaders raise many kinds (SafetensorError, OSError, RuntimeError, ...) on a bad file
            # the resume checkpoint is blamed unless the error is plainly elsewhere: out of memory, or a missing
            # file outside the checkpoint (e.g. the base model); those pass through unchanged
            if self.resume is None or self.run is None or "out of memory" in str(e).lower() or \
                    (isinstance(e, FileNotFoundError) and
                     self.resume.resolve() not in Path(str(e.filename or "")).resolve().parents):
                raise
            k = int(self.resume.name.split("_")[-1])
            raise ResumeError(self.run.unusable_state(k, f"its checkpoint {self.resume} cannot be loaded "
                                                         f"({type(e).__name__}: {e})")) from e

    def close(self) -> None:
        """Free the rollout engine (vLLM holds its KV cache until closed); the trainer goes with the object (under
        a launcher, the other ranks are told to drop theirs)."""
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def _open(self) -> Runtime:
        from ragen.agent.chat import ChatRenderer
        from ragen.models import load_tokenizer
        from ragen.rollout.factory import make_engine
        from ragen.sft.pipeline import warm_start_path
        from ragen.train.checkpoint import model_dir
        from ragen.train.ranks import announcer, launched
        from ragen.train.trainer import Trainer

        m = self.cfg.model
        channel = announcer()  # rank 0 leading a launch (train/ranks.py)
        if launched():  # the launcher's process group first: the trainer's ranks must share it, not an engine's
            from ragen.train.ds import ensure_distributed

            if channel is None and self.cfg.rollout.engine == "vllm":
                raise LaunchError("rollout.engine=vllm under a launcher needs rank 0 to lead the other ranks (they "
                                  "build their engines with it): start the run with `ragen train` on every rank")
            ensure_distributed()
        self.tokenizer = load_tokenizer(m.base, m.tokenizer, m.trust_remote_code)
        self.renderer = ChatRenderer(self.tokenizer, m.end_of_turn_token)
        start = warm_start_path(self.cfg)  # the SFT checkpoint RL starts from, if any (reference model too)
        # a resumed run samples from the weights of its last completed iteration, exactly as it would have
        engine_path = str(model_dir(self.resume)) if self.resume else start
        if channel is not None and self.cfg.rollout.engine == "vllm":  # a vLLM engine on every rank
            from ragen.rollout.shards import engines_on_every_rank
            from ragen.train.ranks import check_engine_layout

            check_engine_layout(channel.world, self.cfg.rollout.tensor_parallel_size)
            self.engine = engines_on_every_rank(self.cfg, engine_path, channel)
        else:  # alone, or rank 0's HF engine under a launch
            self.engine = make_engine(self.cfg, self.tokenizer, model_path=engine_path)
        self.trainer = Trainer(self.cfg, resume=self.resume, renderer=self.renderer, model_path=start)
        if self.cfg.rollout.sync_floor_factor > 0:  # both hold the same weights now: the gate's precision floor
            self.trainer.calibrate(self.engine)
        return self


def generate_instances(cfg: Config, run: RunDir, k: int) -> Path:
    from ragen.envs.instances import write_instances
    from ragen.rollout.runner import instances_for

    return write_instances(instances_for(cfg, "train", k), run.iteration(k) / "instances.parquet")


def collect_rollouts(rt: Runtime, run: RunDir, k: int, instances: Path) -> tuple[Path, dict[str, float]]:
    from ragen.envs.instances import read_instances
    from ragen.rollout.runner import collect
    from ragen.rollout.table import write_rollouts

    c = collect(rt.cfg, rt.engine, rt.renderer, mode="train", iteration=k, instances=read_instances(instances))
    out = write_rollouts(c.rollouts, run.iteration(k) / "rollouts.parquet")
    return out, {_train_key(key): v for key, v in c.metrics.items()}


def _train_key(key: str) -> str:
    """Env metrics (``Bandit/success``) become ``train/Bandit/success`` beside ``val/...``; others stay."""
    return key if key.startswith(("timing_s/", "rollout/")) else f"train/{key}"


@dataclass
class Batch:
    """The filtered batch of an iteration: kept trajectories (in memory, as docs/design.md has it) + filter metrics;
    the decisions themselves are in ``filter.json`` beside the rollouts."""

    rollouts: Any  # pandas DataFrame
    metrics: dict[str, float]


def filter_batch(cfg: Config, run: RunDir, k: int, rollouts: Path) -> Batch:
    """StarPO-S variance filter over iteration k's rollouts; writes which groups were kept to filter.json."""
    from ragen.rollout.table import read_rollouts
    from ragen.train.trainer import filter_rollouts

    df = read_rollouts(rollouts)
    kept, metrics = filter_rollouts(cfg, df)
    groups = sorted(int(g) for g in df["group"].unique())
    kept_groups = sorted(int(g) for g in kept["group"].unique())
    write_json(run.iteration(k) / "filter.json", {"groups": groups, "kept_groups": kept_groups,
                                                  "filter_ratio": cfg.algorithm.filter_ratio,
                                                  "filter_type": cfg.algorithm.filter_type, **metrics})
    return Batch(kept, metrics)


def update_policy(rt: Runtime, run: RunDir, k: int, batch: Batch) -> dict[str, float]:
    """Update on iteration k's filtered batch, sync the new weights into the engine, and save the state."""
    t0 = time.monotonic()
    rt.engine.sleep()  # vLLM on a GPU gives its memory to the update; the sync wakes it
    res = rt.trainer.update(batch.rollouts, k)
    res.metrics.update(batch.metrics)
    t1 = time.monotonic()
    gate = rt.trainer.sync(rt.engine)
    t2 = time.monotonic()
    rt.trainer.save(run.state(k))
    metrics = dict(res.metrics)
    metrics.update({"sync/gate_mean_abs": gate.mean_abs, "sync/gate_max_abs": gate.max_abs,
                    "sync/gate_mean_tol": gate.mean_tol,
                    "timing_s/step": t1 - t0, "timing_s/sync": t2 - t1, "timing_s/save": time.monotonic() - t2})
    return metrics


def evaluate(rt: Runtime, out: Path) -> dict[str, float]:
    """Score the current weights on the fixed validation seeds (the ``eval.panel`` when set, else envs.val),
    written to ``out`` as JSON."""
    t0 = time.monotonic()
    if rt.cfg.eval.panel is not None:
        from ragen.eval.evaluate import evaluate_panel, load_panel, write_eval

        panel = load_panel(rt.cfg)
        res = evaluate_panel(rt.cfg, rt.engine, rt.renderer, panel)
        rollouts, found = res.rollouts, res.metrics
        # the panel evaluation as `ragen eval` writes it: a grid's evaluation stage reuses the last iteration's
        write_eval(res, panel_eval_dir(out), {"panel": str(rt.cfg.eval.panel), "panel_name": panel.name,
                                              "tags": panel.tags, "greedy": False})
    else:
        from ragen.rollout.runner import collect

        c = collect(rt.cfg, rt.engine, rt.renderer, mode="val")
        rollouts, found = c.rollouts, c.metrics
    metrics = {f"val/{key}": v for key, v in found.items() if not key.startswith(("timing_s", "rollout/", "eval/"))}
    metrics["val/score"] = float(rollouts["score"].mean())
    metrics["timing_s/eval"] = time.monotonic() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, metrics)
    return metrics


def panel_eval_dir(eval_json: Path) -> Path:
    """Where an in-run evaluation on ``eval.panel`` keeps its panel metrics and rollouts (beside eval.json)."""
    return eval_json.with_name(eval_json.stem + "-panel")


def diagnose(cfg: Config, run: RunDir, k: int, metrics: dict[str, float]) -> dict[str, float]:
    """Echo Trap warnings at iteration k from the metrics of iterations 0..k-1 (on disk) and k's."""
    from ragen.algos.echo_trap import echo_trap

    history = [m for j in run.completed() if j < k and (m := run.metrics(j))]
    d = cfg.diagnostics
    return echo_trap([*history, metrics], window=d.window, std_collapse=d.std_collapse,
                     entropy_change=d.entropy_change, grad_spike=d.grad_spike)


def should_evaluate(cfg: Config, k: int, last: int) -> bool:
    return (k + 1) % cfg.trainer.test_freq == 0 or k == last


def best_iteration(run: RunDir) -> int | None:
    """The completed iteration with the highest validation score (first on ties)."""
    best, score = None, -math.inf
    for k in run.completed():
        p = run.iteration(k) / "eval.json"
        if p.is_file():
            s = json.loads(p.read_text()).get("val/score", -math.inf)
            if s > score:
                best, score = k, s
    return best


def finish_iteration(cfg: Config, run: RunDir, k: int, metrics: dict[str, float]) -> list[int]:
    """metrics.json, then the marker (the iteration now counts as done), then prune old states."""
    write_json(run.iteration(k) / "metrics.json", metrics)
    run.mark_complete(k, {"iteration": k, "time": time.time()})
    return prune_states(run, cfg.trainer.checkpoint_every, best_iteration(run), resume_state=cfg.trainer.resume_state)
