"""The training loop over the iteration stages. ``ops`` is where the stages come from: ragen.run.iteration itself
(plain calls: tests, notebooks, the pipeline benchmark's baseline) or tasks.stages (the same functions as Prefect
tasks, composed by flows/train_loop.py), so both paths run one piece of control flow."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ragen.config import Config
from ragen.run import guard
from ragen.run import iteration as plain_ops
from ragen.run.iteration import EVAL_INIT, Runtime, should_evaluate
from ragen.run.rundir import RunDir


@dataclass
class LoopResult:
    run: RunDir
    resumed_at: int = 0
    iterations: list[int] = field(default_factory=list)  # completed by this call
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    eval_init: dict[str, float] | None = None
    rollbacks: list[guard.Rollback] = field(default_factory=list)  # by the collapse guard, in this call


def with_iterations(overrides: list[str] | None, iterations: int | None) -> list[str]:
    """Overrides plus ``--iterations`` as the trainer.total_training_steps it stands for."""
    return [*(overrides or []), *([f"trainer.total_training_steps={iterations}"] if iterations is not None else [])]


def open_run(cfg: Config, name: str) -> tuple[RunDir, Runtime, int]:
    """Bind the config to the run directory; the runtime (not yet opened) starts at the run's resume point, with
    the remedies of the collapse guard's earlier rollbacks (guard.json) applied."""
    from ragen.run.disk import check_disk

    run = RunDir.at(cfg.trainer.run_dir, name)
    check_disk(cfg, run.root)  # a disk too small for the run's checkpoints stops it now, not at its 150th iteration
    run.bind_config(cfg)
    guard.finish_pending(run)  # a rollback a crash interrupted, before the resume point is read
    start = run.next_iteration()
    for j in range(start):  # a damaged metrics.json (the guard and the diagnostics read them) fails before loading
        run.metrics(j)
    eff = guard.effective_config(cfg, guard.GuardState.read(run)) if cfg.guard.enabled else cfg
    return run, Runtime(eff, resume=run.resume_state(), run=run), start


def guard_check(cfg: Config, run: RunDir, k: int) -> guard.Rollback | None:
    """After iteration k: roll back when the configured Echo Trap signals have been on for ``guard.patience``
    iterations since the last rollback (``GuardGaveUp`` once the rollbacks are used up)."""
    state = guard.GuardState.read(run)
    history = [run.metrics(j) for j in run.completed() if state.floor < j <= k]
    n = guard.streak(history, cfg.guard.signals)
    if n < cfg.guard.patience:
        return None
    return guard.roll_back(run, cfg, state, at=k, first_bad=k - n + 1,
                           signals=guard.signals_on(history[-1], cfg.guard.signals))


def run_iteration(rt: Runtime, run: RunDir, k: int, last: int, ops: ModuleType | Any = plain_ops
                  ) -> dict[str, float]:
    t0 = time.monotonic()
    inst = ops.generate_instances(rt.cfg, run, k)
    rollouts, metrics = ops.collect_rollouts(rt, run, k, inst)
    metrics.update(ops.update_policy(rt, run, k, ops.filter_batch(rt.cfg, run, k, rollouts)))
    if should_evaluate(rt.cfg, k, last):
        metrics.update(ops.evaluate(rt, run.iteration(k) / "eval.json"))
    metrics.update(plain_ops.diagnose(rt.cfg, run, k, metrics))  # cheap and pure: no task of its own
    metrics["timing_s/iteration"] = time.monotonic() - t0
    ops.finish_iteration(rt.cfg, run, k, metrics)
    return metrics


def run_training(cfg: Config, name: str, *, ops: ModuleType | Any = plain_ops,
               iteration: Callable[..., dict[str, float]] | None = None,
               on_iteration: Callable[[int, dict[str, float]], None] | None = None,
               on_rollback: Callable[[guard.Rollback], None] | None = None) -> LoopResult:
    """Run (or continue) the run ``name`` up to ``trainer.total_training_steps`` iterations; ``iteration``
    replaces ``run_iteration`` (e.g. by a subflow around it). With ``guard.enabled``, a collapse rolls the run
    back to a healthy checkpoint and it trains on from there with the remedy (``on_rollback`` hears of it).
    The run directory is locked for the call: a second process on the same run gets ``RunBusyError``."""
    with RunDir.at(cfg.trainer.run_dir, name).locked():
        return _run_training(cfg, name, ops, iteration, on_iteration, on_rollback)


def _run_training(cfg: Config, name: str, ops: ModuleType | Any, iteration: Callable[..., dict[str, float]] | None,
                on_iteration: Callable[[int, dict[str, float]], None] | None,
                on_rollback: Callable[[guard.Rollback], None] | None) -> LoopResult:
    run, rt, start = open_run(cfg, name)
    res = LoopResult(run, resumed_at=start)
    last = cfg.trainer.total_training_steps - 1
    if start > last:
        return res  # already complete: nothing to load
    if start == 0:  # model.warm_start=auto: make the SFT checkpoint first if missing (a no-op after flows/sft)
        from ragen.sft.pipeline import ensure_warm_start

        ensure_warm_start(cfg)
    rt.open()
    try:
        if cfg.trainer.val_before_train and start == 0:
            res.eval_init = ops.evaluate(rt, run.root / EVAL_INIT)
        step = iteration or (lambda rt_, run_, k_, last_: run_iteration(rt_, run_, k_, last_, ops))
        k = start
        while k <= last:
            res.metrics[k] = step(rt, run, k, last)
            res.iterations.append(k)
            if on_iteration is not None:
                on_iteration(k, res.metrics[k])
            event = guard_check(cfg, run, k) if cfg.guard.enabled else None
            if event is None:
                k += 1
                continue
            res.rollbacks.append(event)
            if on_rollback is not None:
                on_rollback(event)
            rt.close()  # the healthy checkpoint (or the base model) with the remedied settings
            rt = Runtime(guard.effective_config(cfg, guard.GuardState.read(run)), resume=run.resume_state(),
                         run=run).open()
            k = event.to + 1
    finally:
        rt.close()
    return res
