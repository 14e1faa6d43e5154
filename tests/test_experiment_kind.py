"""The project's MLflow experiments open on their training runs in the MLflow UI: created with the experiment kind
the UI reads, and an older experiment without it gets it on its next use (tasks/tracking.py)."""

import pytest

from ragen.config import load_config
from tasks.tracking import EXPERIMENT_KIND, TRAINING_KIND, experiment_id, mlflow_client

pytestmark = pytest.mark.integration


def test_experiments_are_made_and_mended_as_training_experiments(tmp_path):
    cfg = load_config(None, ["cpu-small"], [f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'm.db'}",
                                            f"tracking.mlflow_artifact_location={tmp_path / 'art'}"])
    client = mlflow_client(cfg)
    made = experiment_id(client, cfg, "fresh")
    assert client.get_experiment(made).tags[EXPERIMENT_KIND] == TRAINING_KIND == "custom_model_development"
    old = client.create_experiment("made-before")  # as an earlier version of the project made them: no kind
    assert EXPERIMENT_KIND not in client.get_experiment(old).tags
    assert experiment_id(client, cfg, "made-before") == old
    assert client.get_experiment(old).tags[EXPERIMENT_KIND] == TRAINING_KIND


def test_more_metrics_than_one_batch_holds_are_all_logged(tmp_path):
    """MLflow's client cuts a batch within the store's limits (1,000 metrics) itself: every value arrives."""
    from tasks.tracking import log_metrics

    cfg = load_config(None, ["cpu-small"], [f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'm.db'}",
                                            f"tracking.mlflow_artifact_location={tmp_path / 'art'}"])
    client = mlflow_client(cfg)
    run = client.create_run(experiment_id(client, cfg, "many")).info.run_id
    log_metrics(client, run, 3, {f"m/{i}": float(i) for i in range(2500)})
    got = client.get_run(run).data.metrics
    assert len(got) == 2500 and got["m/2499"] == 2499.0
