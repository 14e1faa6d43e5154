"""Flow ``ragen``: a training run as one subflow per iteration over the stage tasks (tasks/stages.py), with the
control flow of ragen.run.loop. Deployment ``train-loop`` serves it (``prefect deployment run ragen/train-loop``);
``ragen train`` calls it in-process. Every (re)start continues the named run after its last completed iteration."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.exceptions import ExternalSignal

from flows import trust
from flows.sft import sft_flow
from ragen.config import Config, load_config
from ragen.run import loop
from ragen.run.guard import GuardState, Rollback
from ragen.run.iteration import Runtime
from ragen.run.rundir import RunDir
from ragen.sft import pipeline as sft_pipeline
from tasks import model_registry, stages, tracking, versioning

# Runtimes of the flow runs in this process, by run directory: a subflow gets the key, never the object, since
# Prefect encodes (deep-copies) flow parameters to record them, and the engines and trainer must not be copied.
RUNTIMES: dict[str, Runtime] = {}


@flow(name="iteration", flow_run_name="iteration-{k}", persist_result=False)
def iteration_flow(run_root: str, k: int, last: int, run_id: str | None = None) -> dict[str, float]:
    """The stages, then (once the iteration is complete on disk) DVC versioning and MLflow logging: both are
    retried and, failing that, reported; neither can undo or stop the iteration."""
    rt, run = RUNTIMES[run_root], RunDir(Path(run_root))
    cfg = rt.cfg
    if cfg.tracking.dvc:
        versioning.forget(run, k)  # recomputing an iteration (after a manual rollback): its old pointers go
    metrics = loop.run_iteration(rt, run, k, last, ops=stages)
    if cfg.tracking.dvc:
        t0 = time.monotonic()
        metrics.update(tracking.reported(run, f"DVC versioning of iteration {k}", versioning.version_iteration,
                                         cfg, run, k, last) or {})
        metrics["timing_s/version"] = time.monotonic() - t0
    if run_id is not None:
        t0 = time.monotonic()
        tracking.reported(run, f"MLflow logging of iteration {k}", tracking.log_iteration, cfg, run, run_id, k,
                          metrics, pause=cfg.tracking.mlflow_tracking_uri)
        metrics["timing_s/log"] = time.monotonic() - t0
    return metrics


def stopped_from_outside(e: BaseException) -> bool:
    """Whether ``e`` is, or was raised while unwinding from, a stop from outside (SIGTERM or Ctrl-C as
    KeyboardInterrupt, a worker's cancel as ExternalSignal). Prefect's task engine can replace the interrupt with its
    own error when it lands between a task's start and its run record ("Task run is not set"); the interrupt is then
    that error's context."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt | ExternalSignal):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def flow_config(params: str | None, preset: list[str] | str | None, overrides: list[str] | None,
            iterations: int | None) -> Config:
    presets = [preset] if isinstance(preset, str) else list(preset or [])
    return load_config(params, presets, loop.with_iterations(overrides, iterations))


@flow(name="ragen", flow_run_name="{run_name}", persist_result=False)
@trust.gated
def train_loop(run_name: str = "default", params: str | None = "params.yaml", preset: list[str] | None = None,
               overrides: list[str] | None = None, iterations: int | None = None) -> dict[str, Any]:
    """Train (or continue) run ``run_name``: config = params file <- presets <- overrides (``key=value``)."""
    cfg = flow_config(params, preset, overrides, iterations)  # a deployment run's were checked first (trust.gated)
    run = RunDir.at(cfg.trainer.run_dir, run_name)
    with run.locked():  # one process per run directory (a second start is refused before it logs anything)
        return _train(run, cfg, run_name, params, preset, overrides, iterations)


def _train(run: RunDir, cfg: Config, run_name: str, params: str | None, preset: list[str] | None,
           overrides: list[str] | None, iterations: int | None) -> dict[str, Any]:
    log = get_run_logger()
    run.bind_config(cfg)  # refuses a restart with other settings before anything is logged
    if sft_pipeline.needs_build(cfg) and run.next_iteration() == 0:  # model.warm_start=auto: warm-start first
        sft_pipeline.check_buildable_here()
        log.info("model.warm_start=auto: making the SFT checkpoint %s first", cfg.sft.output)
        sft_flow(params, preset, loop.with_iterations(overrides, iterations), evaluate=False)
    if cfg.tracking.dvc:
        versioning.check_remote(cfg, run)  # a missing DVC repo or remote is a set-up error: say so before training
        for path in versioning.check_resume_data(run):  # damaged versioned data stops the start, named
            log.warning("%s could not be checked against its DVC pointer: its listing is not in the DVC cache "
                        "(`dvc fetch` brings it back)", path)
    run_id = tracking.reported(run, "MLflow start", tracking.start_tracking, cfg, run)

    def report(k: int, m: dict[str, float]) -> None:
        log.info("iteration %d: val score %.3f, actor grad norm %.3g, %.0f s", k, m.get("val/score", float("nan")),
                 m.get("actor/grad_norm", float("nan")), m["timing_s/iteration"])

    def step(rt: Runtime, run_: RunDir, k: int, last: int) -> dict[str, float]:
        RUNTIMES[str(run_.root)] = rt
        try:
            return iteration_flow(str(run_.root), k, last, run_id)
        finally:
            RUNTIMES.pop(str(run_.root), None)

    def rolled_back(event: Rollback) -> None:
        n = len(GuardState.read(run).rollbacks)
        log.warning("collapse guard: %s at iteration %d; rolled back to after iteration %d (learning rates x%.3g, "
                    "%s), the rolled-back iterations are in %s", ", ".join(event.signals), event.at, event.to,
                    event.lr_factor, ", ".join(event.overrides) or "no other remedy", run.root / event.archived)
        if run_id is not None:
            tracking.reported(run, "MLflow guard event", tracking.log_rollback, cfg, run_id, n, event.__dict__,
                              pause=cfg.tracking.mlflow_tracking_uri)

    try:
        res = loop.run_training(cfg, run_name, ops=stages, iteration=step, on_iteration=report,
                                on_rollback=rolled_back)
    except BaseException as e:
        if run_id is not None:  # stopped from outside (SIGTERM, Ctrl-C, a cancel) is KILLED; anything else FAILED
            status = "KILLED" if stopped_from_outside(e) else "FAILED"
            tracking.reported(run, "MLflow end", tracking.end_tracking, cfg, run_id, status)
        raise
    done = run.completed()
    if cfg.tracking.dvc and done:  # a no-op unless a kill came between the last iteration and its versioning
        tracking.reported(run, "DVC versioning (catch-up)", versioning.version_iteration, cfg, run, done[-1],
                          cfg.trainer.total_training_steps - 1)
    if run_id is not None:
        if done and done[-1] not in tracking.logged(run):  # skipped while MLflow paused: one last try, no pause
            tracking.reported(run, "MLflow logging (catch-up)", tracking.log_iteration, cfg, run, run_id, done[-1],
                              json.loads((run.iteration(done[-1]) / "metrics.json").read_text()))
        tracking.reported(run, "MLflow summary", tracking.log_summary, cfg, run, run_id)
        tracking.reported(run, "MLflow model registration", model_registry.register_model, cfg, run, run_id)
        tracking.reported(run, "MLflow end", tracking.end_tracking, cfg, run_id, "FINISHED")
    return {"run_dir": str(res.run.root), "mlflow_run_id": run_id, "resumed_at": res.resumed_at,
            "iterations": res.iterations, "eval_init": res.eval_init,
            "last_metrics": res.metrics[res.iterations[-1]] if res.iterations else None}
