"""Several processes open a fresh MLflow sqlite store at the same instant (what two runs started together do):
each gets its MLflow run. Before the store's opening was serialised, the loser of the schema-migration race
failed with "table _alembic_tmp_experiments already exists" and its run never reached MLflow."""

import multiprocessing

from ledger import declares

from ragen.config import load_config

PROCESSES = 4
ROUNDS = 3


def start_run(uri: str, artifacts: str, barrier, out) -> None:
    from tasks.tracking import experiment_id, mlflow_client

    cfg = load_config(overrides=[f"tracking.mlflow_tracking_uri={uri}",
                                 f"tracking.mlflow_artifact_location={artifacts}", "tracking.experiment=race"])
    barrier.wait(timeout=60)  # every process opens the store at once
    try:
        client = mlflow_client(cfg)
        run = client.create_run(experiment_id(client, cfg))
        client.log_metric(run.info.run_id, "x", 1.0, step=0)
        out.put(("ok", run.info.run_id))
    except Exception as e:  # reported to the test, which names what each process met
        out.put(("error", f"{type(e).__name__}: {e}"[:500]))


@declares("MLflow store opened by several processes at once")
def test_processes_opening_a_fresh_store_together_each_get_their_run(tmp_path, fault):
    import mlflow

    import tasks.tracking  # noqa: F401 - imported before the fork, so the processes start together

    fault("MLflow store opened by several processes at once")
    ctx = multiprocessing.get_context("fork")
    for r in range(ROUNDS):
        uri = f"sqlite:///{tmp_path / f'mlflow-{r}.db'}"
        barrier, out = ctx.Barrier(PROCESSES), ctx.Queue()
        procs = [ctx.Process(target=start_run, args=(uri, str(tmp_path / "artifacts"), barrier, out))
                 for _ in range(PROCESSES)]
        for p in procs:
            p.start()
        results = [out.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        errors = [msg for status, msg in results if status == "error"]
        assert errors == [], f"round {r}: {len(errors)} of {PROCESSES} processes lost their run: {errors}"
        ids = {msg for _, msg in results}
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name("race")
        assert exp is not None
        found = {run.info.run_id for run in client.search_runs([exp.experiment_id])}
        assert len(ids) == PROCESSES and found == ids, f"round {r}: logged {sorted(ids)}, the store has {found}"
