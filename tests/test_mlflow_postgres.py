"""MLflow on PostgreSQL (infra/mlflow/): a real PostgreSQL cluster (Debian's server, 127.0.0.1, started here;
.ci/run installs it), an `mlflow server` over it that stores and serves the artifacts, a 2-iteration tiny training
logging to that server, and the run read back with the MLflow client and straight from the database."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from listening import listen_addresses
from test_loop import TINY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def pg_dir():
    """A folder the `postgres` user can reach when the tests run as root (pytest's own tmp_path sits under a
    0700 directory, and the services no longer open the parents of a data directory)."""
    d = Path(tempfile.mkdtemp(prefix="ragen-pg-test-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_training_logs_to_an_mlflow_server_on_postgresql(prefect_api, tmp_path, pg_dir):
    import mlflow

    from servers.local import LocalMLflowServer, LocalPostgres

    with LocalPostgres(pg_dir / "pg") as pg, \
            LocalMLflowServer(pg.url, tmp_path / "store", env=pg.client_env) as srv:
        assert listen_addresses(pg.port) == {"127.0.0.1"} and listen_addresses(srv.port) == {"127.0.0.1"}
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
    assert not (pg_dir / "pg" / "postmaster.pid").exists()  # stopped cleanly


def test_missing_postgres_binaries_name_the_fix(monkeypatch, tmp_path):
    from servers import local as services

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(services, "Path", lambda *a: tmp_path / "none" if a == ("/usr/lib/postgresql",) else Path(*a))
    with pytest.raises(services.ServiceError, match="apt-get install postgresql"):
        services.pg_bin("initdb")


def test_a_server_that_cannot_start_names_its_log(tmp_path):
    from servers.local import LocalMLflowServer, ServiceError

    bad = LocalMLflowServer("notadb://x", tmp_path / "store", startup_timeout=60)
    with pytest.raises(ServiceError, match=r"mlflow-server\.log"):
        bad.start()
    bad.stop()


def test_postgres_asks_for_its_password_and_listens_on_loopback_only(pg_dir):
    import psycopg2

    from servers.local import LocalPostgres, pg_bin

    with LocalPostgres(pg_dir / "pg") as pg:
        assert listen_addresses(pg.port) == {"127.0.0.1"}
        assert oct(pg.password_file.stat().st_mode & 0o777) == "0o600" and len(pg.password) >= 24
        assert pg.password not in pg.url
        with pytest.raises(psycopg2.OperationalError, match="password"):
            psycopg2.connect(host="127.0.0.1", port=pg.port, user=pg.user, dbname=pg.db, password="")
        with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
            psycopg2.connect(host="127.0.0.1", port=pg.port, user=pg.user, dbname=pg.db, password="guess")
        assert pg.query("SELECT current_user") == [(pg.user,)]
        hba = [ln.split() for ln in (pg.data_dir / "pg_hba.conf").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]
        assert hba and all(ln[-1] == "scram-sha-256" for ln in hba)

    # a cluster an earlier version made with trust authentication gets the password on its next start
    old = pg_dir / "old"
    old.mkdir()
    pg = LocalPostgres(old)
    pg._owned()
    pg._run([pg_bin("initdb"), "-D", str(old), "-U", pg.user, "--auth=trust", "-E", "UTF8"], "initdb")
    with pg:
        with pytest.raises(psycopg2.OperationalError, match="password"):
            psycopg2.connect(host="127.0.0.1", port=pg.port, user=pg.user, dbname="postgres", password="")
        assert pg.query("SELECT 1") == [(1,)]


@pytest.mark.skipif(os.geteuid() != 0, reason="the postgres user and closed parents matter under root")
def test_a_data_directory_the_server_cannot_reach_is_an_error_not_a_chmod(tmp_path):
    from servers.local import LocalPostgres, ServiceError

    closed = tmp_path / "closed"
    (closed / "pg").mkdir(parents=True)
    closed.chmod(0o700)
    with pytest.raises(ServiceError, match=f"{closed} is closed to other users"):
        LocalPostgres(closed / "pg").start()
    assert closed.stat().st_mode & 0o777 == 0o700  # left as it was
