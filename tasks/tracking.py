"""MLflow tracking of a training run: one MLflow run per run directory (its id is kept in the run directory, so
a resumed run keeps logging to the same MLflow run), flattened params, tags, metrics with step = iteration.

Logging never stops training: each call is retried and, if the tracking server still fails, reported in the log
and in ``<run>/tracking-failures.jsonl``; the iteration's data is already on disk either way."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from ragen.config import Config, config_to_dict, flatten
from ragen.io import write_text_atomic
from ragen.models.precision import precision_tags
from ragen.run.iteration import EVAL_INIT
from ragen.run.rundir import MARKER, RunDir
from tasks.options import NO_RESULT
from tasks.versioning import dvc_md5, dvc_revision

RUN_ID = "mlflow-run-id"  # the run id, then the tracking URI it lives at
LOGGED = "mlflow-logged.json"  # iterations whose metrics reached MLflow
FAILURES = "tracking-failures.jsonl"
# the experiment tag the MLflow UI (3.x) reads to choose its view: training runs, not the GenAI traces overview
EXPERIMENT_KIND, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
_BAD_NAME = re.compile(r"[^\w\-. :/]")


# MLflow's HTTP client retries a down server with backoff for minutes per call by default; each task here is
# retried anyway and then reported, so an unreachable server costs training seconds, not minutes
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}


def hung(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition for MLflow tasks: retry a failure, but not a request that timed out (a hung
    server would cost a whole request timeout per retry); the pause in ``reported`` takes it from there."""
    try:
        state.result()
    except Exception as e:
        return "timed out" not in str(e).lower()
    return True


def mlflow_client(cfg: Config) -> Any:
    import os

    import mlflow

    for key, value in HTTP_DEFAULTS.items():  # a user's own setting wins
        os.environ.setdefault(key, value)
    uri = cfg.tracking.mlflow_tracking_uri
    mlflow.set_tracking_uri(uri)
    with store_opening_lock(uri):
        return mlflow.MlflowClient(uri)


@contextlib.contextmanager
def store_opening_lock(uri: str) -> Iterator[None]:
    """Serialise the opening of a sqlite store across processes. The first client of a process creates and
    migrates the database; two processes opening a fresh one at once race on that migration (one fails with
    "table _alembic_tmp_experiments already exists" and loses its MLflow run). An exclusive lock on
    ``<db>.lock`` beside the database makes the second wait until the first has migrated; a store that is
    already open in this process (MLflow caches it) costs one uncontended lock. Other stores need no lock."""
    import fcntl

    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with db.with_name(db.name + ".lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        check_sqlite_store(db)
        yield


SQLITE_HEADER = b"SQLite format 3\x00"


def _drop_cached_stores() -> None:
    """Forget MLflow's cached stores and their SQLAlchemy engines (mlflow 3.17 keeps both for the process)."""
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore
    from mlflow.tracking._model_registry.registry import ModelRegistryStoreRegistry
    from mlflow.tracking._tracking_service.registry import TrackingStoreRegistry

    TrackingStoreRegistry._get_store_with_resolved_uri.cache_clear()
    ModelRegistryStoreRegistry._get_store_with_resolved_uri.cache_clear()
    for store in (TrackingStore, RegistryStore):
        with store._engine_map_lock:
            for engine in store._engine_map.values():
                engine.dispose()
            store._engine_map.clear()


_SEEN: dict[Path, tuple[int, int] | None] = {}  # store file -> (device, inode) when this process last opened it


def check_sqlite_store(db: Path) -> None:
    """A store file that is not an SQLite database (damaged, overwritten) is an error naming the fix, instead of
    an SQLAlchemy traceback on every call. MLflow keeps one store, with its database connection, per URI for the
    life of the process: when the file was moved aside or replaced since this process opened it (a long-running
    worker after the fix this error names), those stores are dropped so the new file is the one used."""
    st = db.stat() if db.exists() else None
    ident = (st.st_dev, st.st_ino) if st is not None else None
    if _SEEN.get(db) is not None and _SEEN[db] != ident:
        _drop_cached_stores()
    _SEEN[db] = ident
    if db.is_file() and st.st_size > 0:
        with db.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
        if head != SQLITE_HEADER:
            raise RuntimeError(f"the MLflow store {db} is not an SQLite database (damaged or overwritten), so "
                               f"nothing can be logged to it; training goes on. Move it aside (`mv {db} "
                               f"{db}.damaged`) or restore it from a backup: the next start of each run logs its "
                               f"completed iterations to the store again from their metrics.json")


def git_commit(where: Path | None = None) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              timeout=10, cwd=where).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def artifact_location(cfg: Config) -> str | None:
    """Where a new MLflow experiment keeps its artifacts: a local folder (as a file URI), a store URI as given
    (s3://, gs://, mlflow-artifacts:/), or None: the tracking server's own store (what a shared server wants)."""
    loc = cfg.tracking.mlflow_artifact_location
    if not loc:
        return None
    if re.match(r"^[A-Za-z][\w+.-]+:/", loc):
        return loc
    return Path(loc).resolve().as_uri()


def experiment_id(client: Any, cfg: Config, name: str | None = None) -> str:
    """The id of MLflow experiment ``name`` (default: tracking.experiment), created when missing."""
    name = name or cfg.tracking.experiment
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.tags.get(EXPERIMENT_KIND) is None:  # made before the kind was set: the UI opened on GenAI traces
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND, TRAINING_KIND)
        return exp.experiment_id
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(name, artifact_location=artifact_location(cfg),
                                        tags={EXPERIMENT_KIND: TRAINING_KIND})
    except MlflowException:
        exp = client.get_experiment_by_name(name)  # another process created it in between
        if exp is None:
            raise
        return exp.experiment_id


@task(name="start_tracking", retries=3, retry_delay_seconds=2, **NO_RESULT)
def start_tracking(cfg: Config, run: RunDir) -> str:
    """The MLflow run of this run directory: created with params and tags on the first start, reused after."""
    client = mlflow_client(cfg)
    id_file = run.root / RUN_ID
    if id_file.is_file():
        run_id, _, uri = id_file.read_text().strip().partition("\n")
        if uri in ("", cfg.tracking.mlflow_tracking_uri):  # else: logged elsewhere now, start a run there
            from mlflow.exceptions import MlflowException

            try:
                client.update_run(run_id, status="RUNNING")
                return run_id
            except MlflowException as e:  # the store lost it (a damaged mlflow.db replaced by a new one)
                if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
    # a new MLflow run; with the ledger gone, the next logged iteration brings every completed one before it
    r = client.create_run(experiment_id(client, cfg), run_name=run.root.name,
                          tags={**run_tags(client, cfg, str(run.root), git_commit()), **precision_tags(cfg)})
    # the id first: a retry after a failed params batch must reuse this run, not create a second one
    write_text_atomic(id_file, f"{r.info.run_id}\n{cfg.tracking.mlflow_tracking_uri}\n")
    (run.root / LOGGED).unlink(missing_ok=True)
    log_params(client, r.info.run_id, cfg)
    client.log_artifact(r.info.run_id, str(run.root / "config.yaml"))
    return r.info.run_id


def run_tags(client: Any, cfg: Config, run_dir: str, commit: str) -> dict[str, str]:
    """The tags of a training run: where and from what it ran, its ``tracking.tags`` (a grid run's experiment and
    knobs) and, in a sweep, its parent (the MLflow UI nests it and compares it with its siblings)."""
    tags = {"git_commit": commit, "preset": ",".join(cfg.preset) or "none",
            "experiment": cfg.tracking.experiment, "run_dir": run_dir, **cfg.tracking.tags}
    parent = sweep_run(client, cfg)
    if parent is not None:
        tags.update({"mlflow.parentRunId": parent, "ragen_sweep": str(cfg.tracking.sweep), "ragen_role": "child"})
    return tags


def log_params(client: Any, run_id: str, cfg: Config) -> None:
    """The resolved config, flattened (``agent.max_actions_per_turn``, ...), as the run's params."""
    from mlflow.entities import Param

    params = [Param(k, (v if isinstance(v, str) else json.dumps(v))[:6000])  # MLflow's value length limit
              for k, v in flatten(config_to_dict(cfg)).items()]
    client.log_batch(run_id, params=params)  # MLflow cuts it into batches of its limit (100 params) itself


def rebuild_run(client: Any, cfg: Config, exp: str, name: str, tags: dict[str, str], init: dict[str, float] | None,
                iterations: Iterable[tuple[int, dict[str, float]]]) -> tuple[str, bool]:
    """A finished run's MLflow run made again from its files: (run id, whether it was created). A run named
    ``name`` already in experiment ``exp`` is returned as it is, so rebuilding twice adds nothing. A new one gets
    ``tags``, the config's params, the panel before training as ``init/...`` at step 0 and each iteration's
    metrics at its step; the caller logs its own extras and ends it."""
    found = client.search_runs([exp], f"attributes.run_name = '{name}'", max_results=1)
    if found:
        return found[0].info.run_id, False
    run_id = client.create_run(exp, run_name=name, tags=tags).info.run_id
    log_params(client, run_id, cfg)
    if init:
        log_metrics(client, run_id, 0, {f"init/{k}": v for k, v in init.items()})
    for k, metrics in iterations:
        log_metrics(client, run_id, k, metrics)
    return run_id, True


def read_run_id(run: RunDir) -> str | None:
    p = run.root / RUN_ID
    return p.read_text().split()[0] if p.is_file() else None


def metric_name(key: str) -> str:
    """MLflow allows alphanumerics and ``_-. :/`` in names: ``pass@4`` becomes ``pass_at_4``."""
    return _BAD_NAME.sub("_", key.replace("@", "_at_"))


def log_metrics(client: Any, run_id: str, step: int, metrics: dict[str, float], when: float | None = None
                 ) -> None:
    from mlflow.entities import Metric

    now = int((when if when is not None else time.time()) * 1000)  # a retry logs the same point again, not a new one
    ms = [Metric(metric_name(key), float(v), now, step) for key, v in sorted(metrics.items())
          if isinstance(v, int | float)]
    client.log_batch(run_id, metrics=ms)  # MLflow cuts it into batches within the store's limits itself


def logged(run: RunDir) -> set[int]:
    p = run.root / LOGGED
    return set(json.loads(p.read_text())) if p.is_file() else set()


@task(name="log_iteration", retries=3, retry_delay_seconds=2, timeout_seconds=600, retry_condition_fn=hung,
      **NO_RESULT)
def log_iteration(cfg: Config, run: RunDir, run_id: str, k: int, metrics: dict[str, float]) -> None:
    """Iteration k, after any earlier completed iteration that never reached MLflow (killed or failed before its
    logging): each from its metrics.json, then k with the flow's extra timings. The ledger ``mlflow-logged.json``
    records what was logged."""
    done = logged(run)
    for j in run.completed():
        if j < k and j not in done:
            _log_one(cfg, run, run_id, j, json.loads((run.iteration(j) / "metrics.json").read_text()))
            done.add(j)
    _log_one(cfg, run, run_id, k, metrics)
    done.add(k)
    write_text_atomic(run.root / LOGGED, json.dumps(sorted(done)) + "\n")


def _log_one(cfg: Config, run: RunDir, run_id: str, k: int, metrics: dict[str, float]) -> None:
    """Metrics at step k (timestamped by the iteration's completion), the DVC hashes of what it versioned (tags),
    sample trajectories as HTML, and on evaluation iterations the curves so far. Iteration 0 also logs the
    pre-training eval at step 0."""
    from ragen.report.trajectories import render_trajectories_html
    from ragen.rollout.table import read_rollouts

    client = mlflow_client(cfg)
    marker = run.iteration(k) / MARKER
    when = json.loads(marker.read_text()).get("time") if marker.is_file() else None
    log_metrics(client, run_id, k, metrics, when)
    init = run.root / EVAL_INIT
    if k == 0 and init.is_file():
        log_metrics(client, run_id, 0, {f"init/{key}": v for key, v in json.loads(init.read_text()).items()})
    for name, path in ((f"dvc/data/iter_{k:05d}", run.iteration(k)), (f"dvc/checkpoint/iter_{k:05d}", run.state(k))):
        md5 = dvc_md5(run, path)
        if md5 is not None:
            client.set_tag(run_id, name, md5)
    if cfg.tracking.dvc:
        client.set_tag(run_id, "dvc_revision", dvc_revision(run))
    rollouts = run.iteration(k) / "rollouts.parquet"
    if rollouts.is_file():
        m = cfg.model
        html = render_trajectories_html(read_rollouts(rollouts), n=8, title=f"{run.root.name}: iteration {k}",
                                        decode=_decoder(m.base, m.tokenizer, m.trust_remote_code))
        client.log_text(run_id, html, f"trajectories/iter_{k:05d}.html")
    if any(key.startswith("val/") for key in metrics):
        _log_plots(client, run, run_id)


@functools.cache
def _decoder(base: str, tokenizer: str | None, trust_remote_code: bool) -> Any:
    """Token ids -> text for the trajectory pages (the rollouts table stores ids); loaded once per process."""
    from ragen.models import load_tokenizer

    tok = load_tokenizer(base, tokenizer, trust_remote_code)
    return lambda ids: tok.decode(list(ids), skip_special_tokens=True)


def _log_plots(client: Any, run: RunDir, run_id: str) -> None:
    from ragen.report.plots import plot_training_curves

    history = {j: json.loads((run.iteration(j) / "metrics.json").read_text()) for j in run.completed()
               if (run.iteration(j) / "metrics.json").is_file()}
    with tempfile.TemporaryDirectory() as d:
        for png in plot_training_curves(history, Path(d)):
            client.log_artifact(run_id, str(png), "plots")


@task(name="log_summary", retries=3, retry_delay_seconds=2, **NO_RESULT)
def log_summary(cfg: Config, run: RunDir, run_id: str) -> None:
    """At the end of a run: the final curves and the resolved config as ``params.yaml``."""
    client = mlflow_client(cfg)
    _log_plots(client, run, run_id)
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(run.root / "config.yaml", Path(d) / "params.yaml")
        client.log_artifact(run_id, str(Path(d) / "params.yaml"))


@task(name="log_rollback", retries=3, retry_delay_seconds=2, retry_condition_fn=hung, **NO_RESULT)
def log_rollback(cfg: Config, run_id: str, n: int, event: dict[str, Any]) -> None:
    """A collapse-guard rollback: metric ``guard/rollbacks`` (= n) at the iteration that tripped it, and a tag
    ``guard/rollback_<n>`` with what happened (signals, where training continues, the learning-rate factor)."""
    client = mlflow_client(cfg)
    log_metrics(client, run_id, int(event["at"]), {"guard/rollbacks": float(n)})
    client.set_tag(run_id, f"guard/rollback_{n}", json.dumps(event, sort_keys=True))


@task(name="end_tracking", retries=3, retry_delay_seconds=2, **NO_RESULT)
def end_tracking(cfg: Config, run_id: str, status: str = "FINISHED") -> None:
    mlflow_client(cfg).set_terminated(run_id, status=status)


def pause_s() -> float:
    """How long MLflow calls pause after one failed (``RAGEN_MLFLOW_PAUSE_S``, default ``PAUSE_S``)."""
    import os

    raw = os.environ.get("RAGEN_MLFLOW_PAUSE_S", str(PAUSE_S))
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"RAGEN_MLFLOW_PAUSE_S={raw!r} is not a number of seconds") from None


# after an MLflow call fails (a hung server costs a whole request timeout per try), the per-iteration calls to that
# store pause this long, then one is tried again; what they would have logged is caught up from metrics.json
PAUSE_S = 600.0
_paused: dict[str, tuple[float, str]] = {}  # tracking URI -> (pause ends, monotonic; the failure)


def reported(run: RunDir, what: str, fn: Any, *args: Any, pause: str | None = None) -> Any:
    """Call a tracking or versioning task; after its retries, record the failure instead of raising (the
    iteration's data is on disk; DVC versioning and MLflow logging catch up later). ``pause``: a tracking URI
    whose calls pause after a failure (``PAUSE_S``): while paused, the call is skipped and recorded as such."""
    held = _paused.get(pause) if pause is not None else None
    if held is not None and time.monotonic() < held[0]:
        _record(run, what, f"skipped: MLflow calls pause for another {held[0] - time.monotonic():.0f} s after a "
                           f"failure ({held[1]}); the values are logged from metrics.json once it answers")
        return None
    try:
        out = fn(*args)
    except Exception as e:  # tracking must never stop training
        get_run_logger().warning("%s failed after retries: %s", what, e)
        _record(run, what, repr(e))
        if pause is not None:
            _paused[pause] = (time.monotonic() + pause_s(), f"{what}: {str(e)[:200]}")
        return None
    if pause is not None:
        _paused.pop(pause, None)
    return out


def _record(run: RunDir, what: str, error: str) -> None:
    with (run.root / FAILURES).open("a") as f:
        f.write(json.dumps({"what": what, "error": error, "time": time.time()}) + "\n")


def sweep_run(client: Any, cfg: Config) -> str | None:
    """The parent MLflow run of ``tracking.sweep`` in this experiment (created on first use), or None."""
    if not cfg.tracking.sweep:
        return None
    exp = experiment_id(client, cfg)
    found = client.search_runs([exp], f"tags.ragen_sweep = '{cfg.tracking.sweep}' and tags.ragen_role = 'sweep'",
                               max_results=1)
    if found:
        return found[0].info.run_id
    r = client.create_run(exp, run_name=cfg.tracking.sweep,
                          tags={"ragen_sweep": cfg.tracking.sweep, "ragen_role": "sweep", "git_commit": git_commit()})
    return r.info.run_id
