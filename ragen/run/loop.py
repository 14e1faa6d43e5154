"""The training loop as plain function calls over the iteration stages: what the Prefect flow composes, run
without any orchestrator (``ragen train --no-prefect``, tests, the pipeline benchmark's baseline)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ragen.config import Config
from ragen.run.iteration import (
    EVAL_INIT,
    Runtime,
    collect_rollouts,
    evaluate,
    finish_iteration,
    generate_instances,
    should_evaluate,
    update_policy,
)
from ragen.run.rundir import RunDir


@dataclass
class LoopResult:
    run: RunDir
    iterations: list[int] = field(default_factory=list)  # completed by this call
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    eval_init: dict[str, float] | None = None


def open_run(cfg: Config, name: str) -> tuple[RunDir, Runtime, int]:
    """Bind the config to the run directory and open the runtime at its resume point."""
    run = RunDir.at(cfg.trainer.run_dir, name)
    run.bind_config(cfg)
    start = run.next_iteration()
    return run, Runtime(cfg, resume=run.resume_state()), start


def run_iteration(rt: Runtime, run: RunDir, k: int, last: int) -> dict[str, float]:
    t0 = time.monotonic()
    inst = generate_instances(rt.cfg, run, k)
    rollouts, metrics = collect_rollouts(rt, run, k, inst)
    metrics.update(update_policy(rt, run, k, rollouts))
    if should_evaluate(rt.cfg, k, last):
        metrics.update(evaluate(rt, run.iteration(k) / "eval.json"))
    metrics["timing_s/iteration"] = time.monotonic() - t0
    finish_iteration(rt.cfg, run, k, metrics)
    return metrics


def train_loop(cfg: Config, name: str, *,
               on_iteration: Callable[[int, dict[str, float]], None] | None = None) -> LoopResult:
    """Run (or continue) the run ``name`` up to ``trainer.total_training_steps`` iterations."""
    run, rt, start = open_run(cfg, name)
    rt.open()
    res = LoopResult(run)
    last = cfg.trainer.total_training_steps - 1
    init = run.root / EVAL_INIT
    if cfg.trainer.val_before_train and start == 0:
        res.eval_init = evaluate(rt, init)
    for k in range(start, last + 1):
        res.metrics[k] = run_iteration(rt, run, k, last)
        res.iterations.append(k)
        if on_iteration is not None:
            on_iteration(k, res.metrics[k])
    return res

