"""``ragen bench pipeline``: what orchestration (Prefect + MLflow + DVC) costs per iteration, in one run.

One run alternates iterations done as plain calls (ragen.run.loop.run_iteration) and as the deployed path (the
``iteration`` subflow over Prefect tasks, then DVC versioning and MLflow logging). The stage functions of
ragen.run.iteration are timed on both paths, so an orchestrated iteration's overhead is exactly its wall time
minus the time spent inside the stages; the share is that overhead over the iteration's wall time.

Checkpoint versioning happens on every checkpoint_every-th iteration only, so it is measured once (dvc add + push
of a real checkpoint: without its resume state, as every checkpoint but a run's last is versioned by default, then
with it) and reported amortised over a run of the config's length, beside the per-iteration numbers. The
Prefect start-up of a process (ephemeral API) is paid once per run and reported on its own."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ragen.run import iteration as it
from ragen.run.retention import is_checkpoint_iteration

STAGES = ("generate_instances", "collect_rollouts", "filter_batch", "update_policy", "evaluate", "finish_iteration")


@contextlib.contextmanager
def timed_stages(spent: list[float]) -> Iterator[None]:
    """Time every stage function, whichever path (plain loop or Prefect task) calls it."""
    originals = {name: getattr(it, name) for name in STAGES}

    def timed(fn: Any) -> Any:
        def inner(*a: Any, **kw: Any) -> Any:
            t0 = time.monotonic()
            try:
                return fn(*a, **kw)
            finally:
                spent.append(time.monotonic() - t0)
        return inner

    try:
        for name, fn in originals.items():
            setattr(it, name, timed(fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(it, name, fn)


def checkpoint_version_costs(run: Any, k: int) -> tuple[float, float, int, int]:
    """Seconds to ``dvc add`` + push iteration k's checkpoint without its resume state, then seconds to add + push
    the resume state as well; and the bytes of each part."""
    from dvc.repo import Repo

    from ragen.run.rundir import in_resume_state
    from tasks.versioning import dvc_root, leave_out_resume_state

    st = run.state(k)
    ignore = run.root / ".dvcignore"
    before = ignore.read_text() if ignore.is_file() else None
    times = []
    for with_resume_state in (False, True):
        if with_resume_state:  # the last checkpoint's case: nothing left out
            ignore.unlink() if before is None else ignore.write_text(before)
        else:
            leave_out_resume_state(run, [st], last=k + 1)
        t0 = time.monotonic()
        with Repo(str(dvc_root(run))) as repo:
            repo.add([str(st.resolve())])
            repo.push(targets=[str(run.pointer(st).resolve())])
        times.append(time.monotonic() - t0)
    sizes = {p: p.stat().st_size for p in st.rglob("*") if p.is_file()}
    resume = sum(b for p, b in sizes.items() if in_resume_state(p.relative_to(st)))
    return times[0], times[1], sum(sizes.values()) - resume, resume


def bench_pipeline(params: str | None, presets: list[str], overrides: list[str], iterations: int = 4
                   ) -> dict[str, Any]:
    from prefect import flow

    from flows.train_loop import RUNTIMES, iteration_flow
    from ragen.config import load_config
    from ragen.run.loop import open_run, run_iteration
    from tasks import tracking, versioning

    run_length = load_config(params, presets, overrides).trainer.total_training_steps
    if iterations < 2:
        raise ValueError(f"iterations must be >= 2 (one plain, one orchestrated), got {iterations}")
    with tempfile.TemporaryDirectory(prefix="ragen-bench-") as tmp:
        root = Path(tmp) / "repo"
        versioning.init_repo(root, Path(tmp) / "remote")
        # total_training_steps far beyond the bench: no iteration is the final one (its checkpoint would be
        # versioned as a checkpoint iteration's is; that cost is measured separately below)
        cfg = load_config(params, presets, [*overrides, f"trainer.run_dir={root / 'runs'}",
                                            "trainer.total_training_steps=100000", "trainer.val_before_train=false",
                                            f"trainer.test_freq={max(iterations, 1) * 1000}",
                                            f"tracking.mlflow_tracking_uri=sqlite:///{Path(tmp) / 'mlflow.db'}",
                                            f"tracking.mlflow_artifact_location={Path(tmp) / 'mla'}"])
        run, rt, _ = open_run(cfg, "bench")
        rt.open()
        try:
            t0 = time.monotonic()
            flow(name="bench-warmup")(lambda: None)()  # the process's Prefect start-up, paid once per run
            startup = time.monotonic() - t0
            versioning.check_remote(cfg, run)
            run_id = tracking.start_tracking(cfg, run)
            rows = []
            for k in range(iterations):
                mode = "plain" if k % 2 == 0 else "orchestrated"
                spent: list[float] = []
                with timed_stages(spent):
                    t0 = time.monotonic()
                    if mode == "plain":
                        m = run_iteration(rt, run, k, 100000 - 1)
                    else:
                        RUNTIMES[str(run.root)] = rt
                        m = iteration_flow(str(run.root), k, 100000 - 1, run_id)
                    wall = time.monotonic() - t0
                if mode == "plain":  # untimed: the next orchestrated iteration must version only its own data
                    versioning.version(cfg, run, k, 100000 - 1)
                rows.append({"iteration": k, "mode": mode, "wall_s": wall, "stages_s": sum(spent),
                             "dvc_s": m.get("timing_s/version", 0.0), "mlflow_s": m.get("timing_s/log", 0.0)})
            # a checkpoint iteration's extra cost: dvc add + push of the latest real checkpoint, as every
            # checkpoint but a run's last is versioned (the actor alone, under dvc_resume_state=last), then the
            # rest of it (the resume state), which the last checkpoint adds
            k = iterations - 1
            ckpt, resume, size, resume_size = checkpoint_version_costs(run, k)
        finally:
            rt.close()
    plain = [r for r in rows if r["mode"] == "plain"]
    orch = [r for r in rows if r["mode"] == "orchestrated"]
    over = [r["wall_s"] - r["stages_s"] for r in orch]
    mean_wall = statistics.fmean(r["wall_s"] for r in orch) if orch else float("nan")
    per_iter = statistics.fmean(over) if over else float("nan")
    every, n = cfg.trainer.checkpoint_every, run_length
    versions = sum(is_checkpoint_iteration(j, every, n - 1) for j in range(n))
    # the resume state goes with the last checkpoint only, or with each
    per_run = versions * ckpt + (resume if cfg.tracking.dvc_resume_state == "last" else versions * resume)
    return {
        "preset": ",".join(cfg.preset), "iterations": iterations,
        "plain_iteration_s": statistics.fmean(r["wall_s"] for r in plain) if plain else float("nan"),
        "orchestrated_iteration_s": mean_wall,
        "orchestration_s_per_iteration": per_iter,
        "of_which_dvc_s": statistics.fmean(r["dvc_s"] for r in orch) if orch else float("nan"),
        "of_which_mlflow_s": statistics.fmean(r["mlflow_s"] for r in orch) if orch else float("nan"),
        "orchestration_share": per_iter / mean_wall,
        "checkpoint_version_s": ckpt, "checkpoint_gb": size / 1e9,
        "resume_state_version_s": resume, "resume_state_gb": resume_size / 1e9,
        "dvc_resume_state": cfg.tracking.dvc_resume_state, "checkpoint_every": every, "run_iterations": n,
        "checkpoint_versions_per_run": versions,
        "orchestration_share_with_checkpoints": (per_iter + per_run / n) / (mean_wall + per_run / n),
        "prefect_startup_s": startup, "target_share": 0.05,
        "rows": rows,
    }
