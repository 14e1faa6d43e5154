"""The production path, killed: runs started through the deployment `ragen/train-loop` (a Prefect server, the
process work pool and its worker; the vLLM engine; tiny model). The flow-run process is SIGKILLed during
iteration 1's vLLM rollout; the run is triggered again and killed during its update; triggered a third time, the
Prefect server, the worker and its flow-run process are SIGKILLed together, and the server and worker come back
on the same home and port (the dead run, still Running in the server's database, is marked Crashed so that it
no longer holds the deployment's concurrency slot); a last trigger finishes the run with exactly the metrics and
weights of an uninterrupted deployment run."""

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
from safetensors.torch import load_file
from test_loop import TINY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[2]
STEPS = 2


def final(runs, name):
    d = runs / name
    m = json.loads((d / f"iter_{STEPS - 1:05d}" / "metrics.json").read_text())
    return ({k: v for k, v in m.items() if not k.startswith(("timing_s/", "dvc/")) and "per_s" not in k},
            load_file(str(d / "checkpoints" / f"iter_{STEPS - 1:05d}" / "actor" / "model.safetensors")))


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


@declares("SIGKILL during a vLLM rollout (deployment run)", "SIGKILL during an update (deployment run)",
          "Prefect server and worker SIGKILLed mid-run, then restarted")
def test_sigkill_of_a_deployment_run_during_vllm_rollout_and_update(tmp_path, monkeypatch, fault):
    from flows.serve import LocalPrefect
    from flows.trust import ALLOWED_ROOTS
    from ragen.train.ds import free_port

    in_rollout, in_update = fault("SIGKILL during a vLLM rollout (deployment run)"), fault(
        "SIGKILL during an update (deployment run)")
    orchestration = fault("Prefect server and worker SIGKILLed mid-run, then restarted")
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

        def trigger_until(ready: Callable[[], bool], what: str) -> int:
            """Trigger the run; once ``ready()``, the pid of its flow-run process."""
            from flows.serve import DEPLOYMENT, _bin

            subprocess.run([_bin("prefect"), "deployment", "run", DEPLOYMENT, "--params",
                            json.dumps(params("k"))], env=local.env(), cwd=ROOT, check=True, capture_output=True,
                           timeout=120)
            t0 = time.monotonic()
            while not ready():
                assert time.monotonic() - t0 < 900, f"not ready after 900 s (waiting for {what})"
                time.sleep(0.01)
            pid = trainer_pid(run)
            assert pid is not None, "no process holds the run directory"
            return pid

        def killed(pid: int) -> None:
            os.kill(pid, signal.SIGKILL)
            gone(pid, 60)

        killed(trigger_until((run / "iter_00001" / "instances.parquet").is_file,  # written as the rollout starts
                             "iteration 1's rollout"))
        assert (run / "iter_00000" / "COMPLETE").is_file() and not (run / "iter_00001" / "COMPLETE").exists()
        in_rollout.guard(run)
        last = trigger_until((run / "iter_00001" / "filter.json").is_file, "iteration 1's update")  # right before it
        killed(last)
        assert not (run / "iter_00001" / "COMPLETE").exists()
        in_update.guard(run)

        t = time.time()
        orphan = trigger_until(lambda: trainer_pid(run) not in (None, last) and rewritten(
            run / "iter_00001" / "instances.parquet", t), "iteration 1's rollout, again")
        orchestration.guard(run)
        server, worker = local.procs[0], local.procs[-1]
        # the host's orchestration dies: the server, the worker and the flow-run process it started (its process
        # group). The server's database still says the run is Running, holding the deployment's one concurrency slot
        os.killpg(server.pid, signal.SIGKILL)
        os.killpg(worker.pid, signal.SIGKILL)
        gone(orphan, 60)

    with LocalPrefect(port=port, mode="pool", home=home, cwd=ROOT, logs=logs) as local:
        from flows.serve import _bin

        # the run the dead worker had started is marked Crashed at the restart (not left Running, holding the
        # slot), like the two whose processes the live worker saw killed
        crashed = subprocess.run([_bin("prefect"), "flow-run", "ls", "--state", "CRASHED", "--limit", "50"],
                                 capture_output=True, env=dict(local.env(), COLUMNS="250"), text=True,
                                 timeout=60).stdout
        assert len(re.findall(r"\|\s*k\s*\|", crashed.replace("│", "|"))) == 3, crashed
        again = local.run(params("k"), timeout=900)
        assert again.returncode == 0 and "Completed" in again.stdout, again.stdout + again.stderr

    assert in_rollout.lost_now() == [] and in_update.lost_now() == [] and orchestration.lost_now() == []
    assert (run / f"iter_{STEPS - 1:05d}" / "COMPLETE").is_file()
    (m_ref, w_ref), (m_run, w_run) = final(runs, "ref"), final(runs, "k")
    assert m_run == m_ref
    assert w_run.keys() == w_ref.keys() and all((w_run[k] == w_ref[k]).all() for k in w_ref)
