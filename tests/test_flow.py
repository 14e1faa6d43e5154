"""The Prefect flow `ragen` on the tiny model against a temporary Prefect API (prefect_test_harness): one subflow
per iteration, the stage tasks, and a second start of the same run continuing where the first stopped."""

import asyncio

import pytest
from test_loop import TINY

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


async def runs_named(name):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    async with get_client() as c:
        return await c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[name])))


def test_flow_runs_iterations_as_subflows_and_continues_a_run(harness, tmp_path):
    from flows.train_loop import train_loop

    db = tmp_path / "mlflow.db"
    over = [*TINY, f"trainer.run_dir={tmp_path}", f"tracking.mlflow_tracking_uri=sqlite:///{db}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mlartifacts'}", "tracking.experiment=flow-test"]
    out = train_loop(run_name="t", params=None, preset=["cpu-small"], overrides=over, iterations=1)
    assert out["iterations"] == [0] and out["resumed_at"] == 0
    assert (tmp_path / "t" / "iter_00000" / "COMPLETE").is_file()
    out2 = train_loop(run_name="t", params=None, preset=["cpu-small"], overrides=over, iterations=2)
    assert out2["iterations"] == [1] and out2["resumed_at"] == 1
    assert "val/score" in out2["last_metrics"]
    assert not (tmp_path / "t" / "tracking-failures.jsonl").exists()

    # one MLflow run across the restart: params, per-iteration metrics at step = iteration, the config artifact
    import mlflow

    assert out["mlflow_run_id"] == out2["mlflow_run_id"]
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    r = client.get_run(out["mlflow_run_id"])
    assert r.info.status == "FINISHED" and r.data.tags["preset"] == "cpu-small"
    assert r.data.params["actor.lr"] == "0.001" and r.data.params["envs.train.tags"] == '["SimpleSokoban"]'
    hist = client.get_metric_history(r.info.run_id, "actor/pg_loss")
    assert sorted(m.step for m in hist) == [0, 1]
    assert [m.step for m in client.get_metric_history(r.info.run_id, "init/val/score")] == [0]
    assert "config.yaml" in [a.path for a in client.list_artifacts(r.info.run_id)]
    parents, subs = asyncio.run(runs_named("ragen")), asyncio.run(runs_named("iteration"))
    assert len(parents) == 2 and all(r.state.is_completed() for r in parents)
    assert sorted(r.name for r in subs) == ["iteration-0", "iteration-1"]
    assert all(r.state.is_completed() for r in subs)


def test_ragen_train_cli_runs_the_flow_and_reports_a_finished_run(harness, tmp_path):
    from typer.testing import CliRunner

    from ragen.cli import app

    over = [*TINY, f"trainer.run_dir={tmp_path}", f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'm.db'}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mlartifacts'}", "trainer.val_before_train=false"]
    sets = [a for o in over for a in ("--set", o)]
    args = ["train", "--run", "cli", "--preset", "cpu-small", "--iterations", "1", *sets]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "completed iterations 0..0" in r.output and "val/score" in r.output
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0 and "already complete" in r.output
    r = CliRunner().invoke(app, [*args[:-1], "actor.lr=0.5"])
    assert r.exit_code == 2 and "actor.lr" in r.output
