"""The trust boundary of a deployment run (flows/trust.py): what its parameters may not ask for on a worker."""

import pytest

from flows.trust import ALLOW_REMOTE_CODE, ALLOWED_ROOTS, UntrustedParameters, check_deployment_config
from ragen.config import load_config

pytestmark = pytest.mark.unit


def cfg(*over):
    return load_config(None, ["cpu-small"], list(over))


def test_the_main_commands_settings_pass(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOWED_ROOTS, raising=False)
    check_deployment_config(cfg(), "params.yaml", project=tmp_path)  # alias model, runs/ and models/ in the project
    check_deployment_config(cfg("model.base=Qwen/Qwen2.5-0.5B-Instruct"), None, project=tmp_path)  # a hub id


def test_remote_code_and_outside_paths_are_refused_unless_the_worker_allows(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOWED_ROOTS, raising=False)
    monkeypatch.delenv(ALLOW_REMOTE_CODE, raising=False)
    project, outside = tmp_path / "project", tmp_path / "elsewhere"
    (outside / "model").mkdir(parents=True)
    bad = cfg("model.trust_remote_code=true", f"model.base={outside / 'model'}", "trainer.run_dir=../runs",
              f"model.warm_start={outside / 'sft'}", "sft.output=/tmp/sft")
    with pytest.raises(UntrustedParameters) as e:
        check_deployment_config(bad, "/etc/ragen.yaml", project=project)
    for key in ("model.trust_remote_code=true", "model.base=", "trainer.run_dir=../runs", "model.warm_start=",
                "sft.output=/tmp/sft", "params=/etc/ragen.yaml"):
        assert key in str(e.value)
    assert "model.tokenizer" not in str(e.value)  # unset: nothing to check
    monkeypatch.setenv(ALLOW_REMOTE_CODE, "1")
    monkeypatch.setenv(ALLOWED_ROOTS, f"{outside}:{tmp_path / 'runs'}:/tmp/sft:/etc")
    check_deployment_config(bad, "/etc/ragen.yaml", project=project)  # the worker allows all of it now
