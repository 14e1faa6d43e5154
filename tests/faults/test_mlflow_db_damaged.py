"""A damaged `mlflow.db` (overwritten with other bytes) under a run that tracks into it (tiny model, the Prefect flow
in-process): training goes on and the failure names the store and the fix; once the file is moved aside, the next
start logs to a new MLflow run every completed iteration, with the values its metrics.json holds."""

import json

import pytest
from ledger import declares
from test_loop import TINY

from ragen.run.rundir import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@declares("corrupted mlflow.db")
def test_a_damaged_mlflow_db_is_named_and_the_run_is_logged_again_later(prefect_api, tmp_path, fault):
    import mlflow

    from flows.train_loop import train_loop

    damaged = fault("corrupted mlflow.db")
    db = tmp_path / "mlflow.db"
    over = [*TINY, f"trainer.run_dir={tmp_path / 'runs'}", "trainer.val_before_train=false", "tracking.dvc=false",
            f"tracking.mlflow_tracking_uri=sqlite:///{db}", f"tracking.mlflow_artifact_location={tmp_path / 'mla'}",
            "tracking.experiment=damaged"]
    run = RunDir(tmp_path / "runs" / "d")

    def train(n):
        return train_loop(run_name="d", params=None, preset=["cpu-small"], overrides=over, iterations=n)

    first = train(1)
    assert first["mlflow_run_id"] and first["iterations"] == [0]
    damaged.guard(run.root)
    db.write_bytes(b"\x00garbage " * 4096)  # e.g. a sync tool or a bad copy overwrote it

    second = train(2)
    assert second["iterations"] == [1] and second["mlflow_run_id"] is None  # training went on
    failures = [json.loads(line) for line in (run.root / "tracking-failures.jsonl").read_text().splitlines()]
    assert any("is not an SQLite database" in f["error"] and f"mv {db} {db}.damaged" in f["error"]
               for f in failures), failures

    db.rename(db.with_name("mlflow.db.damaged"))  # what the message says to do
    third = train(3)
    assert third["iterations"] == [2] and third["mlflow_run_id"] not in (None, first["mlflow_run_id"])
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    for key in ("critic/score/mean", "actor/pg_loss"):
        by_step = {m.step: m.value for m in client.get_metric_history(third["mlflow_run_id"], key)}
        assert sorted(by_step) == [0, 1, 2], key
        for k, v in by_step.items():
            assert v == pytest.approx(run.metrics(k)[key]), (key, k)
    assert client.get_run(third["mlflow_run_id"]).info.status == "FINISHED"
    assert damaged.lost_now() == []
