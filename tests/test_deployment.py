"""Deployment `ragen/train-loop`: a real local Prefect server (sqlite in a temp PREFECT_HOME, 127.0.0.1), the
process serving the deployment, and a run triggered with `prefect deployment run ... --param` that must reach
Completed and leave a completed iteration on disk."""

import json
import subprocess
from pathlib import Path

import pytest
from test_loop import TINY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[1]


def test_prefect_deployment_run_completes(tmp_path):
    from flows.serve import DEPLOYMENT, LocalPrefect, _bin
    from ragen.train.ds import free_port

    over = [*TINY, f"trainer.run_dir={tmp_path / 'runs'}", "trainer.val_before_train=false", "tracking.dvc=false",
            f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mla'}"]
    with LocalPrefect(port=free_port(), home=tmp_path / "prefect", cwd=ROOT, logs=tmp_path / "logs") as local:
        args = [_bin("prefect"), "deployment", "run", DEPLOYMENT, "--param", "run_name=dep",
                "--param", "params=null", "--param", 'preset=["cpu-small"]', "--param", "iterations=1",
                "--param", f"overrides={json.dumps(over)}", "--watch", "--watch-timeout", "1200"]
        r = subprocess.run(args, env=local.env(), cwd=ROOT, capture_output=True, text=True, timeout=1300)
        serve_log = (tmp_path / "logs" / "serve.log").read_text(errors="replace")
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n--- serve.log ---\n{serve_log[-4000:]}"
        assert "Completed" in r.stdout
        listed = subprocess.run([_bin("prefect"), "flow-run", "ls", "--state", "COMPLETED"], capture_output=True,
                                env=dict(local.env(), COLUMNS="250"), text=True, timeout=60)
        assert "| dep " in listed.stdout.replace("│", "|") and "iteration-0" in listed.stdout
    assert (tmp_path / "runs" / "dep" / "iter_00000" / "COMPLETE").is_file()
    assert not list((tmp_path / "runs" / "dep").glob("tracking-failures.jsonl"))
