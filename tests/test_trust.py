"""The trust boundary: what a deployment run's parameters may not ask for on a worker (flows/trust.py), and what a
checkpoint may hold when a run resumes from it (ragen/train/ds.py)."""

import pytest

from flows.trust import ALLOW_REMOTE_CODE, ALLOWED_ROOTS, UntrustedParameters, check_deployment_config
from ragen.config import load_config


def cfg(*over):
    return load_config(None, ["cpu-small"], list(over))


@pytest.mark.unit
def test_the_main_commands_settings_pass(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOWED_ROOTS, raising=False)
    check_deployment_config(cfg(), "params.yaml", project=tmp_path)  # alias model, runs/ and models/ in the project
    check_deployment_config(cfg("model.base=Qwen/Qwen2.5-0.5B-Instruct"), None, project=tmp_path)  # a hub id


@pytest.mark.unit
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


class _Planted:
    """What a tampered checkpoint could hold: unpickling it runs a call (here: creating a file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


@pytest.mark.integration
@pytest.mark.parametrize("stage", [0, 2])
def test_a_resume_never_unpickles_code_from_a_checkpoint(tmp_path, stage):
    """DeepSpeed's state files load with weights_only (DeepSpeed's own classes allowed): ZeRO-0 and ZeRO-2
    optimizer states load back; a state file with a planted object is refused before it runs."""
    import json

    import torch
    from torch import nn

    from ragen.train.ds import load_engine_state, make_ds_engine, save_engine_state

    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": stage}, "bf16": {"enabled": stage == 2}}))

    def engine():
        torch.manual_seed(0)
        return make_ds_engine(nn.Linear(8, 8), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0, grad_clip=1.0,
                              ds_config=ds)

    a = engine()
    a.backward(a(torch.ones(2, 8, dtype=next(a.module.parameters()).dtype)).float().sum())
    a.step()
    save_engine_state(a, tmp_path / "ck")
    b = engine()
    assert load_engine_state(b, tmp_path / "ck") and b.global_steps == a.global_steps == 1

    marker = tmp_path / "ran"
    state = next((tmp_path / "ck" / "state").glob("mp_rank_*_model_states.pt"))
    saved = torch.load(state, weights_only=True)
    torch.save({**saved, "planted": _Planted(str(marker))}, state)
    with pytest.raises(Exception, match="never has, so it was not loaded"):
        load_engine_state(engine(), tmp_path / "ck")
    assert not marker.exists()
    torch.load(state, weights_only=False)  # the same file, unpickled as DeepSpeed would: the planted call runs
    assert marker.exists()
