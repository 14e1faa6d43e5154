"""A DVC remote that stops answering, through `ragen train` on the Prefect flow (tiny model, temporary git + DVC
repo): a real HTTP remote on 127.0.0.1 (tests/faults/http_remote.py) takes iteration 0, then holds every request
without an answer. The push of iteration 1 is stopped at its deadline (tracking.dvc_push_timeout_s), later pushes
pause instead of waiting again, training goes on and every iteration is versioned in the local cache. When the
remote answers again, the next start pushes everything it missed, and every object on it hashes to its name."""

import os
import subprocess
import sys
from pathlib import Path

# imported at collection: DVC binds its log handlers to the stderr of the moment (see test_dvc_remote_storage)
import dvc  # noqa: F401
import pytest
from http_remote import http_remote
from ledger import declares
from remote_checks import failures, misnamed, on_remote, remote_objects
from test_loop import TINY
from typer.testing import CliRunner

from cli.main import app
from ragen.run.rundir import RunDir
from tasks.versioning import status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
DVC = str(Path(sys.executable).with_name("dvc"))
ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 6


def train_args(repo, tmp_path, iterations):
    over = [*TINY, f"trainer.run_dir={repo / 'runs'}", "trainer.val_before_train=false", "tracking.dvc=true",
            f"tracking.dvc_push_timeout_s={DEADLINE_S}",
            f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mlartifacts'}"]
    return ["train", "--run", "r", "--preset", "cpu-small", "--iterations", str(iterations),
            *[a for o in over for a in ("--set", o)]]


def train(repo, tmp_path, iterations):
    r = CliRunner().invoke(app, train_args(repo, tmp_path, iterations))
    assert r.exit_code == 0, r.output[-3000:]
    assert f"..{iterations - 1}" in r.output.split("completed iterations")[-1], r.output[-3000:]


@declares("DVC remote stops answering (a real HTTP server)")
def test_a_dvc_remote_that_stops_answering_costs_one_deadline_and_is_caught_up(prefect_api, dvc_repo, tmp_path,
                                                                                 fault):
    hung = fault("DVC remote stops answering (a real HTTP server)")
    run = RunDir(dvc_repo / "runs" / "r")
    with http_remote(tmp_path / "http-remote") as remote:
        subprocess.run([DVC, "remote", "add", "-f", "-d", "web", remote.url], cwd=dvc_repo, check=True)
        train(dvc_repo, tmp_path, 1)
        assert on_remote(dvc_repo, run) == {} and failures(run) == []

        hung.guard(run.root)
        remote.hanging.set()
        train(dvc_repo, tmp_path, 3)
        assert remote.held > 0  # the remote really held requests unanswered
        got = failures(run)
        what = [f["what"] for f in got]
        assert what[0] == "DVC versioning of iteration 1", got
        assert f"did not finish within tracking.dvc_push_timeout_s={DEADLINE_S} s" in got[0]["error"], got[0]
        # one deadline waited (iteration 1, not retried); iteration 2 and the end-of-run catch-up did not wait again
        assert [f for f in got if "push skipped" not in f["error"]] == got[:1], got
        assert {"DVC versioning of iteration 2", "DVC versioning (catch-up)"} <= set(what), got
        assert status(run) == {} and all(run.is_versioned(run.iteration(k)) for k in (1, 2))
        assert hung.lost_now() == []

        remote.hanging.clear()  # the remote answers again
        assert on_remote(dvc_repo, run) != {}  # iterations 1 and 2 are not on it yet
        failed = len(failures(run))
        # the next start (a new process: the pause lives in the one that saw the timeout) sends what was missed
        env = dict(os.environ, PREFECT_API_URL=prefect_api, PYTHONUNBUFFERED="1")
        again = subprocess.run([str(Path(sys.executable).with_name("ragen")), *train_args(dvc_repo, tmp_path, 4)],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
        assert "completed iterations 3..3" in again.stdout
        assert len(failures(run)) == failed
        assert on_remote(dvc_repo, run) == {}
        objects = remote_objects(remote.root)
        assert len(objects) >= 10
        assert misnamed(objects) == []
        assert hung.lost_now() == []
