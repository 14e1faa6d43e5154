"""The DVC remote on a real small file system (a tmpfs mounted over the test's remote folder; root with
CAP_SYS_ADMIN, else skipped), through `ragen train` on the Prefect flow (tiny model, temporary git + DVC repo):
- full: shrunk until iteration 1's objects no longer fit (a real ENOSPC from the kernel on upload);
- read-only: remounted read-only (a real EROFS) while iteration 2 is pushed.
Each time training goes on (versioning is retried, then recorded in tracking-failures.jsonl, never fatal) and the
iteration is complete and versioned in the local cache; given room again, the next iteration's versioning pushes
everything that was missed, every object on the remote hashes to its name, and a completed iteration comes back
from the remote alone."""

import json
import sys
from pathlib import Path

# imported at collection: DVC binds its log handlers to the stderr of the moment, and an import inside a CliRunner
# call would bind them to a stream closed after it, turning each logged upload error into a LoggingException
import dvc  # noqa: F401
import pytest
from damage import pull_back_from_remote_alone
from filesystems import remount, tmpfs, used
from ledger import declares
from remote_checks import failures, on_remote
from test_loop import TINY
from typer.testing import CliRunner

from cli.main import app
from ragen.run.rundir import RunDir
from tasks.dvc_verify import verify_objects
from tasks.versioning import status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
DVC = str(Path(sys.executable).with_name("dvc"))


@pytest.fixture
def remote_fs(dvc_repo, tmp_path):
    with tmpfs(tmp_path / "remote", "1g") as mnt:
        yield mnt


def train(repo, tmp_path, iterations):
    over = [*TINY, f"trainer.run_dir={repo / 'runs'}", "trainer.val_before_train=false", "tracking.dvc=true",
            f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mlartifacts'}"]
    r = CliRunner().invoke(app, ["train", "--run", "r", "--preset", "cpu-small", "--iterations", str(iterations),
                                 *[a for o in over for a in ("--set", o)]])
    assert r.exit_code == 0, r.output[-3000:]
    assert f"completed iterations {iterations - 1}..{iterations - 1}" in r.output, r.output[-3000:]


@declares("DVC remote full (a real tmpfs)", "DVC remote read-only (a real remount)")
def test_a_full_then_read_only_dvc_remote_then_room_again(prefect_api, dvc_repo, remote_fs, tmp_path, fault):
    full, read_only = fault("DVC remote full (a real tmpfs)"), fault("DVC remote read-only (a real remount)")
    run = RunDir(dvc_repo / "runs" / "r")
    train(dvc_repo, tmp_path, 1)
    assert on_remote(dvc_repo, run) == {} and failures(run) == []

    full.guard(run.root)
    remount(remote_fs, f"size={used(remote_fs) + 64 * 1024}")  # iteration 1's checkpoint no longer fits
    train(dvc_repo, tmp_path, 2)
    # retried, then recorded (again by the run's end-of-run catch-up), never fatal
    assert {f["what"] for f in failures(run)} == {"DVC versioning of iteration 1", "DVC versioning (catch-up)"}
    assert "failed to log" not in json.dumps(failures(run))
    assert status(run) == {} and run.is_versioned(run.iteration(1))  # versioned in the cache, not on the remote
    assert on_remote(dvc_repo, run) != {}

    read_only.guard(run.root)
    remount(remote_fs, "ro")
    train(dvc_repo, tmp_path, 3)
    assert "DVC versioning of iteration 2" in {f["what"] for f in failures(run)}, failures(run)
    assert status(run) == {} and run.is_versioned(run.iteration(2))

    remount(remote_fs, "rw,size=1g")  # room again: the next iteration's versioning catches up
    failed = len(failures(run))
    train(dvc_repo, tmp_path, 4)
    assert len(failures(run)) == failed  # nothing new failed
    assert on_remote(dvc_repo, run) == {}  # every pointer of every iteration is on the remote
    assert full.lost_now() == [] and read_only.lost_now() == []
    v = verify_objects(dvc_repo, repair=False)  # each object's bytes hash to its name (no half-written upload)
    assert v.restored_cache == v.restored_remote == v.lost == [] and v.checked > 0, v.to_dict()
    # iteration 1, whose push failed, comes back from the remote alone
    pull_back_from_remote_alone(dvc_repo, run, 1)
    assert full.lost_now() == []
