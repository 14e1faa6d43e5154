"""Deployment `ragen/train-loop`: a real local Prefect server (sqlite in a temp PREFECT_HOME, 127.0.0.1) and the
process serving the deployment (flow.serve); a run triggered with `prefect deployment run ... --param` must reach
Completed and leave a completed iteration on disk. The process work pool (infra/prefect/prefect.yaml deployed with
`prefect deploy`, a process worker) runs the same flow in tests/faults/test_deployment_kill.py: four triggers,
killed and finished, its server on loopback."""

import json
import subprocess
from pathlib import Path

import pytest
from listening import listen_addresses
from test_loop import TINY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mode", ["serve"])
def test_prefect_deployment_run_completes(tmp_path, mode, monkeypatch):
    from flows.serve import DEPLOYMENT, LocalPrefect, _bin
    from flows.trust import ALLOWED_ROOTS
    from ragen.train.ds import free_port

    monkeypatch.setenv(ALLOWED_ROOTS, str(tmp_path))  # the worker allows this test's run directory

    over = [*TINY, f"trainer.run_dir={tmp_path / 'runs'}", "trainer.val_before_train=false", "tracking.dvc=false",
            f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mla'}"]
    with LocalPrefect(port=free_port(), mode=mode, home=tmp_path / "prefect", cwd=ROOT,
                      logs=tmp_path / "logs") as local:
        assert listen_addresses(local.port) == {"127.0.0.1"}  # the Prefect API server is not reachable from outside
        args = [_bin("prefect"), "deployment", "run", DEPLOYMENT, "--param", "run_name=dep",
                "--param", "params=null", "--param", 'preset=["cpu-small"]', "--param", "iterations=1",
                "--param", f"overrides={json.dumps(over)}", "--watch", "--watch-timeout", "1200"]
        r = subprocess.run(args, env=local.env(), cwd=ROOT, capture_output=True, text=True, timeout=1300)
        log = (tmp_path / "logs" / local.main_log).read_text(errors="replace")
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n--- {local.main_log} ---\n{log[-4000:]}"
        assert "Completed" in r.stdout
        listed = subprocess.run([_bin("prefect"), "flow-run", "ls", "--state", "COMPLETED"], capture_output=True,
                                env=dict(local.env(), COLUMNS="250"), text=True, timeout=60)
        assert "| dep " in listed.stdout.replace("│", "|") and "iteration-0" in listed.stdout
        info = subprocess.run([_bin("prefect"), "deployment", "inspect", DEPLOYMENT], capture_output=True,
                              env=local.env(), text=True, timeout=60).stdout
        assert ("'work_pool_name': 'ragen-process'" in info) == (mode == "pool")
        # a trigger may not turn on remote code on the worker: the run fails before any model loads
        bad = [a.replace(json.dumps(over), json.dumps([*over, "model.trust_remote_code=true"])).replace(
            "run_name=dep", "run_name=untrusted") for a in args]
        r = subprocess.run(bad, env=local.env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
        log = (tmp_path / "logs" / local.main_log).read_text(errors="replace")
        assert r.returncode != 0 and "Failed" in r.stdout, r.stdout
        assert "model.trust_remote_code=true runs the model repository's code" in log
        assert not (tmp_path / "runs" / "untrusted").exists()
    assert (tmp_path / "runs" / "dep" / "iter_00000" / "COMPLETE").is_file()
    assert not list((tmp_path / "runs" / "dep").glob("tracking-failures.jsonl"))
