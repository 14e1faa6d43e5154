"""The MLflow server goes away for part of a run (tiny model, the Prefect flow in-process, a real `mlflow server`
on sqlite): training carries on, the failures are reported in the run directory, and once the server is back
the iterations it missed are logged from their metrics.json."""

import json
import time

import pytest
from ledger import declares
from test_loop import TINY

from ragen.run.rundir import RunDir
from tasks.services import LocalMLflowServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@declares("MLflow server unreachable for part of a run")
def test_mlflow_down_for_an_iteration_is_caught_up_later(prefect_api, tmp_path, fault):
    import mlflow

    from flows.train_loop import train_loop

    outage = fault("MLflow server unreachable for part of a run")
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
