"""Two training runs started at once on one machine (tiny model, the Prefect flow, one DVC repo and remote, one
MLflow sqlite database): each gets its own run directory, MLflow run and DVC pointers, DVC's one-command-per-repo
lock is waited for rather than broken, and a third start of a run that is already training is refused by name."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ledger import declares
from test_loop import TINY

from ragen.run.rundir import RunDir
from tasks.tracking import read_run_id
from tasks.versioning import pointers, status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[2]


def train_cmd(repo, tmp_path, name, lr, iterations):
    over = [*TINY, f"trainer.run_dir={repo / 'runs'}", "trainer.val_before_train=false", "tracking.dvc=true",
            f"actor.lr={lr}", f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mlartifacts'}", "tracking.experiment=concurrent"]
    return [str(Path(sys.executable).with_name("ragen")), "train", "--run", name, "--preset", "cpu-small",
            "--iterations", str(iterations), *[a for o in over for a in ("--set", o)]]


@declares("two runs started at once on one machine", "the same run started twice at once")
def test_two_runs_at_once_then_a_duplicate_start_is_refused(dvc_repo, tmp_path, fault):
    import mlflow

    both, dup = fault("two runs started at once on one machine"), fault("the same run started twice at once")
    env = dict(os.environ, PYTHONUNBUFFERED="1", PREFECT_HOME=str(tmp_path / "prefect"))
    # a has one iteration more than b, so that it is still training when the duplicate start reaches its lock
    iters = {"a": 3, "b": 2}
    procs = {name: subprocess.Popen(train_cmd(dvc_repo, tmp_path, name, lr, iters[name]), cwd=ROOT, env=env,
                                    text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name, lr in (("a", 1e-3), ("b", 2e-3))}
    runs = {name: RunDir(dvc_repo / "runs" / name) for name in procs}
    # each run's first completed iteration is snapshotted the moment it appears, while both processes still run, so
    # "nothing lost" below covers what the other run (and DVC, MLflow) did afterwards
    guarded: set[str] = set()
    t0 = time.monotonic()
    while len(guarded) < 2:
        for name, p in procs.items():
            assert p.poll() is None, f"run {name} ended before both had completed an iteration: not concurrent\n" \
                                     f"{p.communicate()[1][-3000:]}"
        for name, r in runs.items():
            if name not in guarded and r.completed():
                both.guard(r.root)  # its completed iterations (the first) as they are now
                guarded.add(name)
        assert time.monotonic() - t0 < 900
        time.sleep(0.05)
    dup.guard(runs["a"].root)  # a is well under way: start it a second time
    again = subprocess.run(train_cmd(dvc_repo, tmp_path, "a", 1e-3, iters["a"]), cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 2, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"is being trained by pid {procs['a'].pid}" in again.stderr

    for name, p in procs.items():
        out, err = p.communicate(timeout=1200)
        assert p.returncode == 0, f"run {name}:\n{out[-2000:]}\n{err[-3000:]}"
        assert f"completed iterations 0..{iters[name] - 1}" in out
    assert dup.lost_now() == []
    ids = {name: read_run_id(r) for name, r in runs.items()}
    assert None not in ids.values() and ids["a"] != ids["b"]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    for name, r in runs.items():
        assert r.completed() == list(range(iters[name]))
        assert sorted(m.step for m in client.get_metric_history(ids[name], "actor/pg_loss")) == r.completed()
        assert client.get_run(ids[name]).data.params["actor.lr"] == str(1e-3 if name == "a" else 2e-3)
        assert not (r.root / "tracking-failures.jsonl").exists(), (r.root / "tracking-failures.jsonl").read_text()
        assert status(r) == {}
    from dvc.repo import Repo

    with Repo(str(dvc_repo)) as repo:  # every pointer of both runs is on the remote, and the lock is free again
        targets = [str(q) for r in runs.values() for q in pointers(r)]
        assert repo.status(targets=targets, cloud=True) == {}
    assert both.lost_now() == []
