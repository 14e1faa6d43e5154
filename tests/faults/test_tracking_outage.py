"""The MLflow server goes away for part of a run (tiny model, the Prefect flow in-process, a real `mlflow server`
on sqlite): down for a whole start of the run (connection refused), or hung mid-run (its processes stopped, so
requests time out). Training carries on, the failures are reported in the run directory, calls pause after a
hung one, and once the server answers the iterations it missed are logged from their metrics.json."""

import json
import os
import signal
import threading
import time

import pytest
from ledger import declares
from test_loop import TINY

from ragen.run.rundir import RunDir
from servers.local import LocalMLflowServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@declares("MLflow server down for a whole start of the run (connection refused)")
def test_mlflow_down_for_an_iteration_is_caught_up_later(prefect_api, tmp_path, fault):
    import mlflow

    from flows.train_loop import train_loop

    outage = fault("MLflow server down for a whole start of the run (connection refused)")
    port = free_port()
    server = LocalMLflowServer(backend=f"sqlite:///{tmp_path / 'mlflow.db'}", artifacts=tmp_path / "artifacts",
                               port=port)
    over = [*TINY, f"trainer.run_dir={tmp_path / 'runs'}", "trainer.val_before_train=false", "tracking.dvc=false",
            f"tracking.mlflow_tracking_uri={server.url}", "tracking.experiment=outage",
            "tracking.mlflow_artifact_location=null"]  # the server's store (not ./mlartifacts of the project)
    run = RunDir(tmp_path / "runs" / "outage")

    def train(n):
        return train_loop(run_name="outage", params=None, preset=["cpu-small"], overrides=over, iterations=n)

    with server:
        first = train(1)
    assert first["mlflow_run_id"] and first["iterations"] == [0]
    outage.guard(run.root)
    t0 = time.monotonic()
    down = train(2)  # the server is down for this whole start
    slowed = time.monotonic() - t0
    assert down["iterations"] == [1] and down["mlflow_run_id"] is None
    failures = [json.loads(line)["what"] for line in (run.root / "tracking-failures.jsonl").read_text().splitlines()]
    assert "MLflow start" in failures
    with server:  # back, on the same port
        back = train(3)
        client = mlflow.MlflowClient(server.url)
        logged = {key: {m.step: m.value for m in client.get_metric_history(first["mlflow_run_id"], key)}
                  for key in ("critic/score/mean", "actor/pg_loss", "timing_s/iteration")}
        run_info = client.get_run(first["mlflow_run_id"]).info
    assert back["mlflow_run_id"] == first["mlflow_run_id"] and back["iterations"] == [2]
    # iteration 1, trained while the server was down, was logged once it was back: every step, with the values
    # its metrics.json holds
    for key, by_step in logged.items():
        assert sorted(by_step) == [0, 1, 2], key
        for k, value in by_step.items():
            assert value == pytest.approx(json.loads((run.iteration(k) / "metrics.json").read_text())[key]), (key, k)
    assert run_info.status == "FINISHED"
    assert json.loads((run.root / "mlflow-logged.json").read_text()) == [0, 1, 2]
    assert outage.lost_now() == []
    # the retry cap (tasks/tracking.py HTTP_DEFAULTS, with the tasks' own retries): a down server costs seconds
    # beyond the iteration itself and loading the model, where MLflow's default backoff would wait minutes
    iteration_s = json.loads((run.iteration(1) / "metrics.json").read_text())["timing_s/iteration"]
    assert slowed - iteration_s < 60, f"the down server cost {slowed - iteration_s:.0f} s beyond the iteration"


@declares("MLflow server hangs mid-run (its processes stopped: requests time out), then answers again")
def test_an_mlflow_server_that_hangs_mid_run_costs_one_timeout_and_is_caught_up(prefect_api, tmp_path, fault,
                                                                                 monkeypatch):
    import mlflow

    from flows.train_loop import train_loop
    from tasks import tracking

    hang = fault("MLflow server hangs mid-run (its processes stopped: requests time out), then answers again")
    timeout_s, pause_s = 6, 25
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout_s))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("RAGEN_MLFLOW_PAUSE_S", str(pause_s))
    monkeypatch.setattr(tracking, "_paused", {})
    server = LocalMLflowServer(backend=f"sqlite:///{tmp_path / 'mlflow.db'}", artifacts=tmp_path / "artifacts",
                               port=free_port())
    over = [*TINY, f"trainer.run_dir={tmp_path / 'runs'}", "trainer.val_before_train=false", "tracking.dvc=false",
            f"tracking.mlflow_tracking_uri={server.url}", "tracking.experiment=hang", "trainer.test_freq=10",
            "tracking.mlflow_artifact_location=null"]
    run = RunDir(tmp_path / "runs" / "hang")
    iterations = 5
    events = {}
    spent = []  # (what, seconds) of every MLflow call the flow makes through tracking.reported
    reported = tracking.reported

    def timed(run_, what, fn, *args, **kwargs):
        t = time.monotonic()
        try:
            return reported(run_, what, fn, *args, **kwargs)
        finally:
            if what.startswith("MLflow"):
                spent.append((what, time.monotonic() - t))

    monkeypatch.setattr(tracking, "reported", timed)

    def hang_then_answer():
        """Stop the server once iteration 0 is logged; let it answer again once iteration 2 is complete."""
        logged = run.root / "mlflow-logged.json"
        while not (logged.is_file() and 0 in json.loads(logged.read_text() or "[]")):
            time.sleep(0.05)
        os.killpg(server.proc.pid, signal.SIGSTOP)
        events["stopped"] = time.monotonic()
        while not (run.iteration(2) / "COMPLETE").is_file():
            time.sleep(0.05)
        os.killpg(server.proc.pid, signal.SIGCONT)
        events["resumed"] = time.monotonic()

    with server:
        watcher = threading.Thread(target=hang_then_answer, daemon=True)
        watcher.start()
        try:
            t0 = time.monotonic()
            out = train_loop(run_name="hang", params=None, preset=["cpu-small"], overrides=over, iterations=iterations)
            wall = time.monotonic() - t0
        finally:
            if "stopped" in events and "resumed" not in events:
                os.killpg(server.proc.pid, signal.SIGCONT)
        watcher.join(timeout=5)
        assert out["iterations"] == list(range(iterations)) and out["mlflow_run_id"]
        client = mlflow.MlflowClient(server.url)
        logged = {key: {m.step: m.value for m in client.get_metric_history(out["mlflow_run_id"], key)}
                  for key in ("critic/score/mean", "actor/pg_loss")}
        status = client.get_run(out["mlflow_run_id"]).info.status
    hang.guard(run.root)
    failures = [json.loads(line) for line in (run.root / "tracking-failures.jsonl").read_text().splitlines()]
    timed_out = [f for f in failures if "timed out" in f["error"].lower()]
    skipped = [f for f in failures if f["error"].startswith("skipped: MLflow calls pause")]
    # the hang cost one request timeout (no task retry of a timed-out call), then calls paused instead of hanging
    assert len(timed_out) == 1, failures
    assert skipped and all(f["what"].startswith("MLflow logging of iteration") for f in skipped), failures
    logging_s = sum(t for what, t in spent if what.startswith("MLflow logging of iteration"))
    assert logging_s < timeout_s + 10, (spent, wall)  # the per-iteration calls' share: one timeout, not more
    # every value reached MLflow once it answered, equal to what each iteration's metrics.json holds
    for key, by_step in logged.items():
        assert sorted(by_step) == list(range(iterations)), key
        for k, value in by_step.items():
            assert value == pytest.approx(json.loads((run.iteration(k) / "metrics.json").read_text())[key]), (key, k)
    assert status == "FINISHED"
    assert json.loads((run.root / "mlflow-logged.json").read_text()) == list(range(iterations))
    assert hang.lost_now() == []
