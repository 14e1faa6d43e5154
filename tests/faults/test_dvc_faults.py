"""Faults around DVC versioning on the Prefect flow (tiny model, temporary git + DVC repo and local remote):
SIGKILL while iteration 0 is being pushed, then damaged files of completed iterations. The rerun versions and
pushes what the kill left behind (no lock left stuck), and a damaged table or metrics file is named with the
`dvc checkout` that restores it, byte for byte."""

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from damage import flip, pull_back_from_remote_alone
from ledger import declares
from remote_checks import misnamed, on_remote, remote_objects
from test_loop import TINY

from ragen.rollout.table import read_rollouts
from ragen.run.rundir import ResumeError, RunDir
from tasks.versioning import pointers, status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONUNBUFFERED="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
DVC = str(Path(sys.executable).with_name("dvc"))


def train_cmd(repo, tmp_path, iterations):
    over = [*TINY, f"trainer.run_dir={repo / 'runs'}", "trainer.val_before_train=false", "tracking.dvc=true",
            f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mlartifacts'}"]
    return [str(Path(sys.executable).with_name("ragen")), "train", "--run", "pushed", "--preset", "cpu-small",
            "--iterations", str(iterations), *[a for o in over for a in ("--set", o)]]


def replace_with(path, data):
    """Damage a file as a tool that rewrites it would (a new inode: DVC's hardlinked cache copy stays good)."""
    path.unlink()
    path.write_bytes(data)


@declares("SIGKILL during DVC push", "corrupted parquet (versioned)", "corrupted metrics.json (versioned)",
          "checkpoint damaged after versioning (checked against its DVC pointer before a resume)")
def test_sigkill_during_dvc_push_then_damaged_files_are_restored(prefect_api, dvc_repo, tmp_path, fault):
    env = dict(ENV, PREFECT_API_URL=prefect_api)  # the session's Prefect server: no ephemeral one per start
    killed, parquet, metrics = (fault("SIGKILL during DVC push"), fault("corrupted parquet (versioned)"),
                                fault("corrupted metrics.json (versioned)"))
    remote = tmp_path / "remote"
    run = RunDir(dvc_repo / "runs" / "pushed")
    p = subprocess.Popen(train_cmd(dvc_repo, tmp_path, 2), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while not (remote.is_dir() and any(f.is_file() for f in remote.rglob("*"))):  # the first object arrives
        assert p.poll() is None, "the run ended before pushing anything"
        assert time.monotonic() - t0 < 900
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    assert p.wait() == -signal.SIGKILL
    assert run.completed() == [0]
    killed.guard(run.root)

    again = subprocess.run(train_cmd(dvc_repo, tmp_path, 2), cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "completed iterations 1..1" in again.stdout
    assert killed.lost_now() == []
    assert status(run) == {}  # every pointer matches the workspace
    assert on_remote(dvc_repo, run) == {}  # and the remote has every object (iteration 0's too)
    # ... with the right content: each object's bytes hash to its name (files/md5/ab/cdef..., `.dir` listings too),
    # so none is a half-written copy the kill left behind
    # (DVC uploads to a hidden `.<random>.tmp` beside the object and renames it: the kill may leave one, which no
    # pointer names; `ragen runs verify` lists such leftovers)
    objects = remote_objects(remote)
    assert len(objects) >= 10
    assert misnamed(objects) == []
    # and iteration 0 comes back from the remote alone, byte for byte
    pull_back_from_remote_alone(dvc_repo, run, 0)
    assert killed.lost_now() == []
    assert {q.name for q in pointers(run)} >= {"iter_00000.dvc", "iter_00001.dvc", "config.yaml.dvc"}

    # the damage below hits the working copies; what must not be lost is the versioned copy a repair restores
    # from (the remote's objects), read before the repair step
    versioned = [f for f in remote.rglob("*") if f.is_file()]
    table = run.iteration(0) / "rollouts.parquet"
    parquet.guard(*versioned)
    replace_with(table, table.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"dvc checkout .*iter_00000\.dvc"):
        read_rollouts(table)
    m = run.iteration(0) / "metrics.json"
    metrics.guard(*versioned)
    replace_with(m, b'{"actor/pg_loss": 0.1, "val/sc')
    with pytest.raises(ResumeError, match=r"metrics\.json is damaged.*dvc checkout .*iter_00000\.dvc"):
        run.metrics(0)
    r = subprocess.run(train_cmd(dvc_repo, tmp_path, 3), cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)  # a continuation refuses to build on a damaged history, before loading models
    assert r.returncode == 2 and "metrics.json is damaged" in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert parquet.lost_now() == [] and metrics.lost_now() == []  # before the repair: the versioned copy is whole
    out = subprocess.run([DVC, "checkout", "--force", str(run.pointer(run.iteration(0)))], cwd=dvc_repo,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert len(read_rollouts(table)) == 8 and run.metrics(0)  # and the repair brings the files back

    # the checkpoint a continuation starts from, rotted in place after it was versioned (the cache object it is
    # hardlinked to with it): the start refuses it by hash, naming the file and the repair, before loading it
    rotted = fault("checkpoint damaged after versioning (checked against its DVC pointer before a resume)")
    state = run.state(1)
    pulled = subprocess.run([DVC, "fetch", str(run.pointer(state))], cwd=dvc_repo, capture_output=True, text=True)
    assert pulled.returncode == 0, pulled.stderr  # its listing back in the cache (cleared above)
    weights = state / "actor" / "model.safetensors"
    def digests(folder):
        return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in folder.rglob("*") if f.is_file()}

    before = digests(state)
    rotted.guard(*[f for f in remote.rglob("*") if f.is_file()])  # the copy a repair restores from (the cache
    flip(weights)  # object is hardlinked to the working file: it rots with it)
    r = subprocess.run(train_cmd(dvc_repo, tmp_path, 3), cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"{state} no longer matches its DVC pointer" in r.stderr and "actor/model.safetensors" in r.stderr
    assert run.completed() == [0, 1]
    assert rotted.lost_now() == []  # before the repair
    fixed = subprocess.run([str(Path(sys.executable).with_name("ragen")), "runs", "verify", "--repo", str(dvc_repo)],
                           cwd=ROOT, capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    out = subprocess.run([DVC, "checkout", "--force", str(run.pointer(state))], cwd=dvc_repo, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert digests(state) == before  # restored byte for byte
    r = subprocess.run(train_cmd(dvc_repo, tmp_path, 3), cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0 and "completed iterations 2..2" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
