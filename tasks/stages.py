"""The iteration stages as Prefect tasks, one to one over ragen.run.iteration. None of them retries: each writes
iteration data or changes the weights, and a blind retry of an update would apply it twice (resume is the
recovery path instead). The engines live in the flow run's Runtime, passed in-process; no task result is cached
or persisted (the run directory is the record)."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from ragen.config import Config
from ragen.run import iteration as it
from ragen.run.rundir import RunDir
from tasks.options import NO_RESULT

_OPTS = {**NO_RESULT, "retries": 0}


@task(name="generate_instances", **_OPTS)
def generate_instances(cfg: Config, run: RunDir, k: int) -> Path:
    return it.generate_instances(cfg, run, k)


@task(name="collect_rollouts", **_OPTS)
def collect_rollouts(rt: it.Runtime, run: RunDir, k: int, instances: Path) -> tuple[Path, dict[str, float]]:
    return it.collect_rollouts(rt, run, k, instances)


@task(name="filter_batch", **_OPTS)
def filter_batch(cfg: Config, run: RunDir, k: int, rollouts: Path) -> it.Batch:
    return it.filter_batch(cfg, run, k, rollouts)


@task(name="update_policy", **_OPTS)
def update_policy(rt: it.Runtime, run: RunDir, k: int, batch: it.Batch) -> dict[str, float]:
    return it.update_policy(rt, run, k, batch)


@task(name="evaluate", **_OPTS)
def evaluate(rt: it.Runtime, out: Path) -> dict[str, float]:
    return it.evaluate(rt, out)


@task(name="finish_iteration", **_OPTS)
def finish_iteration(cfg: Config, run: RunDir, k: int, metrics: dict[str, float]) -> list[int]:
    return it.finish_iteration(cfg, run, k, metrics)
