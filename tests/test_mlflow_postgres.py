"""MLflow on PostgreSQL (infra/mlflow/): a real PostgreSQL cluster (Debian's server, 127.0.0.1, started here;
.ci/run installs it), an `mlflow server` over it that stores and serves the artifacts, a 2-iteration tiny training
logging to that server, and the run read back with the MLflow client and straight from the database."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_loop import TINY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[1]


def test_training_logs_to_an_mlflow_server_on_postgresql(prefect_api, tmp_path):
    import mlflow

    from tasks.services import LocalMLflowServer, LocalPostgres

    with LocalPostgres(tmp_path / "pg") as pg, LocalMLflowServer(pg.url, tmp_path / "store") as srv:
        over = [*TINY, f"trainer.run_dir={tmp_path / 'runs'}", "tracking.dvc=false", "tracking.experiment=pgtest",
                f"tracking.mlflow_tracking_uri={srv.url}", "tracking.mlflow_artifact_location=null"]
        args = [str(Path(sys.executable).with_name("ragen")), "train", "--run", "pg", "--iterations", "2"]
        for o in over:
            args += ["--set", o]
        env = dict(os.environ, PREFECT_API_URL=prefect_api)  # the session's Prefect server, not an ephemeral one
        r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert not (tmp_path / "runs" / "pg" / "tracking-failures.jsonl").exists()

        client = mlflow.MlflowClient(srv.url)
        exp = client.get_experiment_by_name("pgtest")
        assert exp.artifact_location.startswith("mlflow-artifacts:")  # the server's store, not a client path
        (run,) = client.search_runs([exp.experiment_id])
        assert run.info.status == "FINISHED" and run.info.run_name == "pg"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "actor/pg_loss")] == [0, 1]
        assert run.data.params["agent.max_turn"] == "2"
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"config.yaml", "params.yaml", "plots"} <= names
        assert list((tmp_path / "store").rglob("config.yaml"))  # written by the server, through its proxy
        (version,) = client.search_model_versions("name='pgtest-actor'")
        assert client.get_model_version_by_alias("pgtest-actor", "champion").version == version.version

        # the tracking data lives in PostgreSQL
        assert pg.query("SELECT name, status FROM runs") == [("pg", "FINISHED")]
        assert pg.query("SELECT count(*) FROM metrics WHERE key = 'actor/pg_loss'") == [(2,)]
    assert not (tmp_path / "pg" / "postmaster.pid").exists()  # stopped cleanly


def test_missing_postgres_binaries_name_the_fix(monkeypatch, tmp_path):
    from tasks import services

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(services, "Path", lambda *a: tmp_path / "none" if a == ("/usr/lib/postgresql",) else Path(*a))
    with pytest.raises(services.ServiceError, match="apt-get install postgresql"):
        services.pg_bin("initdb")


def test_a_server_that_cannot_start_names_its_log(tmp_path):
    from tasks.services import LocalMLflowServer, ServiceError

    bad = LocalMLflowServer("notadb://x", tmp_path / "store", startup_timeout=60)
    with pytest.raises(ServiceError, match=r"mlflow-server\.log"):
        bad.start()
    bad.stop()
