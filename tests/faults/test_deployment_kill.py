"""The production path, killed: runs started through the deployment `ragen/train-loop` (a Prefect server, the
process work pool and its worker; the vLLM engine; tiny model). The flow-run process is SIGKILLed during
iteration 1's vLLM rollout; triggered again, the Prefect server, the worker and its flow-run process are SIGKILLed
together during the update, and the server and worker come back on the same home and port (the dead run, still
Running in the server's database, is marked Crashed so that it no longer holds the deployment's concurrency slot);
triggered a last time, the API server alone is SIGKILLed during the rollout and started again while the worker and
the run go on, and the run finishes with exactly the metrics and weights of an uninterrupted deployment run."""

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from ledger import declares
from listening import listen_addresses
from test_loop import TINY
from uninterrupted import STEPS, assert_same_final, final_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[2]


def trainer_pid(run: Path) -> int | None:
    """The pid holding the run directory (the flow-run process the worker started), from its lock file."""
    try:
        text = (run / ".lock").read_text().split()
    except OSError:
        return None
    return int(text[1]) if len(text) == 2 and text[0] == "pid" else None


def gone(pid: int, within: float) -> None:
    from flows.serve import _alive

    t0 = time.monotonic()
    while _alive(str(pid)):
        assert time.monotonic() - t0 < within, f"process {pid} still runs after {within:.0f} s"
        time.sleep(0.1)


def rewritten(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime > since
    except FileNotFoundError:
        return False


def trigger_until(local, params: dict, run: Path, ready: Callable[[], bool], what: str) -> int:
    """Trigger the deployment run; once ``ready()``, the pid of its flow-run process."""
    from flows.serve import DEPLOYMENT, _bin

    subprocess.run([_bin("prefect"), "deployment", "run", DEPLOYMENT, "--params", json.dumps(params)],
                   env=local.env(), cwd=ROOT, check=True, capture_output=True, timeout=120)
    t0 = time.monotonic()
    while not ready():
        assert time.monotonic() - t0 < 900, f"not ready after 900 s (waiting for {what})"
        time.sleep(0.01)
    pid = trainer_pid(run)
    assert pid is not None, "no process holds the run directory"
    return pid


def flow_runs(local, state: str) -> int:
    """How many runs named k the server lists in ``state``."""
    from flows.serve import _bin

    out = subprocess.run([_bin("prefect"), "flow-run", "ls", "--state", state, "--limit", "50"], capture_output=True,
                         env=dict(local.env(), COLUMNS="250"), text=True, timeout=60).stdout
    return len(re.findall(r"\|\s*k\s*\|", out.replace("│", "|")))


@declares("SIGKILL during a vLLM rollout (deployment run)", "SIGKILL during an update (deployment run)",
          "Prefect server and worker SIGKILLed mid-run, then restarted",
          "Prefect API server alone SIGKILLed mid-iteration, then restarted")
def test_sigkill_of_a_deployment_run_during_vllm_rollout_and_update(tmp_path, monkeypatch, fault):
    from flows.serve import LocalPrefect
    from flows.trust import ALLOWED_ROOTS
    from ragen.train.ds import free_port

    in_rollout, in_update = fault("SIGKILL during a vLLM rollout (deployment run)"), fault(
        "SIGKILL during an update (deployment run)")
    orchestration = fault("Prefect server and worker SIGKILLed mid-run, then restarted")
    server_alone = fault("Prefect API server alone SIGKILLed mid-iteration, then restarted")
    monkeypatch.setenv(ALLOWED_ROOTS, str(tmp_path))
    runs = tmp_path / "runs"
    over = [*TINY, "rollout.engine=vllm", "rollout.kv_cache_gib=1", f"trainer.run_dir={runs}",
            "trainer.val_before_train=false", "tracking.dvc=false",
            f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mla'}"]

    def params(name):
        return {"run_name": name, "params": None, "preset": ["cpu-small"], "overrides": over, "iterations": STEPS}

    port, home, logs = free_port(), tmp_path / "prefect", tmp_path / "logs"
    run = runs / "k"
    with LocalPrefect(port=port, mode="pool", home=home, cwd=ROOT, logs=logs) as local:
        # the pool's API server is not reachable from outside (the serve mode's is checked in test_deployment.py)
        assert listen_addresses(local.port) == {"127.0.0.1"}
        ref = local.run(params("ref"), timeout=900)
        assert ref.returncode == 0 and "Completed" in ref.stdout, ref.stdout + ref.stderr

        def killed(pid: int) -> None:
            os.kill(pid, signal.SIGKILL)
            gone(pid, 60)

        # instances.parquet is written as the rollout starts
        killed(trigger_until(local, params("k"), run, (run / "iter_00001" / "instances.parquet").is_file,
                             "iteration 1's rollout"))
        assert (run / "iter_00000" / "COMPLETE").is_file() and not (run / "iter_00001" / "COMPLETE").exists()
        in_rollout.guard(run)
        t = time.time()
        orphan = trigger_until(local, params("k"), run, lambda: trainer_pid(run) is not None and rewritten(
            run / "iter_00001" / "filter.json", t), "iteration 1's update")  # written right before it
        in_update.guard(run)
        orchestration.guard(run)
        server, worker = local.procs[0], local.procs[-1]
        # the host's orchestration dies in the update: the server, the worker and the flow-run process it started
        # (its process group). The server's database still says the run is Running, holding the deployment's one
        # concurrency slot
        os.killpg(server.pid, signal.SIGKILL)
        os.killpg(worker.pid, signal.SIGKILL)
        gone(orphan, 60)
        assert not (run / "iter_00001" / "COMPLETE").exists()

    with LocalPrefect(port=port, mode="pool", home=home, cwd=ROOT, logs=logs) as local:
        # the run the dead worker had started is marked Crashed at the restart (not left Running, holding the
        # slot), like the one whose process the live worker saw killed
        assert flow_runs(local, "CRASHED") == 2
        # triggered again, the API server alone dies during the rollout and comes back on the same port and home;
        # the worker and the flow-run process stay and reconnect (Prefect's client retries for about a minute)
        t = time.time()
        last = trigger_until(local, params("k"), run, lambda: trainer_pid(run) is not None and rewritten(
            run / "iter_00001" / "instances.parquet", t), "iteration 1's rollout, a last time")
        server_alone.guard(run)
        server = local.procs[0]
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        local.restart_server()
        gone(last, 900)
        if (run / f"iter_{STEPS - 1:05d}" / "COMPLETE").is_file():  # it carried on: the server records the end
            assert flow_runs(local, "COMPLETED") == 1, "the run finished but its flow run is not Completed"
        else:  # it stopped: marked as such, and one more trigger resumes it
            assert flow_runs(local, "RUNNING") == 0
            again = local.run(params("k"), timeout=900)
            assert again.returncode == 0 and "Completed" in again.stdout, again.stdout + again.stderr

    assert in_rollout.lost_now() == [] and in_update.lost_now() == [] and orchestration.lost_now() == []
    assert server_alone.lost_now() == []
    assert (run / f"iter_{STEPS - 1:05d}" / "COMPLETE").is_file()
    assert_same_final(run, final_state(runs / "ref"))
