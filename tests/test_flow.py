"""The Prefect flow `ragen` on the tiny model against a temporary Prefect API (the session's, conftest.py): one subflow
per iteration, the stage tasks, and a second start of the same run continuing where the first stopped."""

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest
from test_loop import TINY

pytestmark = pytest.mark.integration


async def runs_named(name, since):
    """Flow runs of the flow ``name`` started after ``since`` (the session's Prefect server holds other tests' too)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterStartTime

    async with get_client() as c:
        return await c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[name])),
                                      flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since)))


def sha(path):
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_flow_versions_tracks_and_continues_a_run(prefect_api, dvc_repo, tmp_path):
    """Real vLLM + DeepSpeed + Prefect + MLflow (temp sqlite) + DVC (temp remote): two starts of one run."""
    import subprocess
    import sys

    from flows.train_loop import train_loop
    from ragen.run.rundir import RunDir
    from tasks import versioning

    db = tmp_path / "mlflow.db"
    over = [*TINY, "rollout.engine=vllm", "rollout.kv_cache_gib=1", f"trainer.run_dir={dvc_repo / 'runs'}",
            f"tracking.mlflow_tracking_uri=sqlite:///{db}", f"tracking.mlflow_artifact_location={tmp_path / 'mla'}",
            "tracking.experiment=flow-test"]
    since = datetime.now(UTC)
    out = train_loop(run_name="t", params=None, preset=["cpu-small"], overrides=over, iterations=1)
    assert out["iterations"] == [0] and out["resumed_at"] == 0
    run = RunDir.at(dvc_repo / "runs", "t")
    assert (run.iteration(0) / "COMPLETE").is_file() and (run.iteration(0) / "filter.json").is_file()
    out2 = train_loop(run_name="t", params=None, preset=["cpu-small"], overrides=over, iterations=2)
    assert out2["iterations"] == [1] and out2["resumed_at"] == 1
    assert "val/score" in out2["last_metrics"] and out2["last_metrics"]["dvc/added"] >= 2
    assert not (run.root / "tracking-failures.jsonl").exists()

    # DVC: everything versioned is unchanged, and each iteration's data comes back from the remote alone
    assert versioning.status(run) == {}
    for k in (0, 1):
        assert run.is_versioned(run.iteration(k)) and run.is_versioned(run.state(k))  # 0 was final once
    before = {k: sha(run.iteration(k) / "rollouts.parquet") for k in (0, 1)}
    import shutil

    shutil.rmtree(dvc_repo / ".dvc" / "cache")
    for k in (0, 1):
        shutil.rmtree(run.iteration(k))
    dvc = str(Path(sys.executable).with_name("dvc"))
    pull = subprocess.run([dvc, "pull", str(run.pointer(run.iteration(0))), str(run.pointer(run.iteration(1)))],
                          cwd=dvc_repo, capture_output=True, text=True)
    assert pull.returncode == 0, pull.stderr
    assert {k: sha(run.iteration(k) / "rollouts.parquet") for k in (0, 1)} == before
    assert run.completed() == [0, 1]

    # MLflow: one run across the restart: params, metrics at step = iteration, artifacts, the registered actor
    import mlflow

    assert out["mlflow_run_id"] == out2["mlflow_run_id"]
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    r = client.get_run(out["mlflow_run_id"])
    assert r.info.status == "FINISHED" and r.data.tags["preset"] == "cpu-small"
    assert r.data.tags["dvc/data/iter_00001"] == versioning_md5(run, run.iteration(1))
    from ragen.config import load_config
    from ragen.models.precision import hardware, model_dtype

    assert r.data.tags["hardware"] == hardware() and r.data.tags["engine_dtype"] == model_dtype(
        load_config(None, ["cpu-small"], over))  # what it computed in here
    assert r.data.params["actor.lr"] == "0.001" and r.data.params["envs.train.tags"] == '["SimpleSokoban"]'
    hist = client.get_metric_history(r.info.run_id, "actor/pg_loss")
    assert sorted(m.step for m in hist) == [0, 1]
    assert [m.step for m in client.get_metric_history(r.info.run_id, "init/val/score")] == [0]
    arts = {a.path for a in client.list_artifacts(r.info.run_id)}
    assert {"config.yaml", "params.yaml", "trajectories", "plots", "model"} <= arts
    traj = {a.path for a in client.list_artifacts(r.info.run_id, "trajectories")}
    assert traj == {"trajectories/iter_00000.html", "trajectories/iter_00001.html"}
    page = Path(client.download_artifacts(r.info.run_id, "trajectories/iter_00000.html", str(tmp_path))).read_text()
    assert "<pre class=\"state\">" in page and "stores token ids" not in page  # decoded, not the fallback note
    assert any(a.path.endswith(".png") for a in client.list_artifacts(r.info.run_id, "plots"))
    versions = client.search_model_versions("name='flow-test-actor'")
    assert sorted(int(v.version) for v in versions) == [1, 2]
    champ = client.get_model_version_by_alias("flow-test-actor", "champion")
    scores = {int(v.version): float(v.tags["val_score"]) for v in versions}
    assert int(champ.version) == (2 if scores[2] > scores[1] else 1)
    parents, subs = asyncio.run(runs_named("ragen", since)), asyncio.run(runs_named("iteration", since))
    assert len(parents) == 2 and all(r.state.is_completed() for r in parents)
    assert sorted(r.name for r in subs) == ["iteration-0", "iteration-1"]
    assert all(r.state.is_completed() for r in subs)


def versioning_md5(run, path):
    from tasks.versioning import dvc_md5

    return dvc_md5(run, path)


def test_ragen_train_cli_runs_the_flow_and_reports_a_finished_run(prefect_api, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    over = [*TINY, f"trainer.run_dir={tmp_path}", f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'm.db'}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mlartifacts'}", "trainer.val_before_train=false",
            "tracking.dvc=false"]
    sets = [a for o in over for a in ("--set", o)]
    args = ["train", "--run", "cli", "--preset", "cpu-small", "--iterations", "1", *sets]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "completed iterations 0..0" in r.output and "val/score" in r.output
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0 and "already complete" in r.output
    r = CliRunner().invoke(app, [*args[:-1], "actor.lr=0.5"])
    assert r.exit_code == 2 and "actor.lr" in r.output


def test_tracking_failures_are_reported_and_never_stop_training(prefect_api, tmp_path):
    from flows.train_loop import train_loop

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the MLflow database's folder should be")
    over = [*TINY, f"trainer.run_dir={tmp_path}", f"tracking.mlflow_tracking_uri=sqlite:///{blocked / 'm.db'}",
            "trainer.val_before_train=false", "tracking.dvc=false"]
    out = train_loop(run_name="nolog", params=None, preset=["cpu-small"], overrides=over, iterations=1)
    assert out["iterations"] == [0] and out["mlflow_run_id"] is None
    assert (tmp_path / "nolog" / "iter_00000" / "COMPLETE").is_file()
    failures = (tmp_path / "nolog" / "tracking-failures.jsonl").read_text()
    assert "MLflow start" in failures
