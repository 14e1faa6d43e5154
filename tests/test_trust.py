"""The trust boundary: what a deployment run's parameters may not ask for on a worker (flows/trust.py), and what a
checkpoint may hold when a run resumes from it (ragen/train/ds.py)."""

import re
from pathlib import Path

import pytest
import yaml

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


# -- the gate every deployment goes through (flows/trust.py ``gated``) ------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.unit
def test_every_deployment_and_every_deployable_flow_goes_through_the_gate():
    import importlib
    import pkgutil

    from prefect import Flow

    import flows
    from flows.serve import deployments
    from flows.sft import sft_flow
    from flows.train_loop import train_loop

    served = {d.name for d in deployments()}
    assert served == {"train-loop", "sft"}
    by_name = {"train-loop": train_loop, "sft": sft_flow}
    ungated = [n for n in served if not getattr(by_name[n].fn, "gated", False)]
    spec = yaml.safe_load((ROOT / "infra" / "prefect" / "prefect.yaml").read_text())
    for d in spec["deployments"]:
        module, name = d["entrypoint"].split(":")
        f = getattr(importlib.import_module(module[:-3].replace("/", ".")), name)
        if not getattr(f.fn, "gated", False):
            ungated.append(d["name"])
    # any flow the package defines could be deployed next: all of them are gated, but the per-iteration subflow,
    # whose parameters are in-process objects (a Runtime) no trigger can pass
    for info in pkgutil.iter_modules(flows.__path__):
        module = importlib.import_module(f"flows.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, Flow) and obj.name != "iteration" and not getattr(obj.fn, "gated", False):
                ungated.append(f"{info.name}:{obj.name}")
    assert not ungated, f"flows that skip the deployment gate (flows/trust.py gated): {sorted(set(ungated))}"


REFUSALS = [
    ({"overrides": ["model.trust_remote_code=true"]}, "model.trust_remote_code=true runs"),
    ({"overrides": ["tracking.mlflow_tracking_uri=http://203.0.113.7:5000"]},
     "tracking.mlflow_tracking_uri=http://203.0.113.7:5000 is not this worker's own"),
    ({"overrides": ["tracking.mlflow_artifact_location=s3://elsewhere/ragen"]},
     "tracking.mlflow_artifact_location=s3://elsewhere/ragen is not this worker's own"),
    ({"overrides": ["sft.output=/etc/ragen-sft"]}, "sft.output=/etc/ragen-sft is outside the project"),
    ({"overrides": ["trainer.run_dir=/var/ragen-runs"]}, "trainer.run_dir=/var/ragen-runs is outside the project"),
    ({"overrides": ["eval.panel=/etc/panel.json"]}, "eval.panel=/etc/panel.json is outside the project"),
    ({"preset": ["../../../etc/x"]}, "preset '../../../etc/x' is not one of the package's presets"),
    ({"params": "/etc/ragen-params.yaml"}, "params=/etc/ragen-params.yaml is outside the project"),
]


@pytest.mark.unit
@pytest.mark.parametrize("flow_name", ["train-loop", "sft"])
@pytest.mark.parametrize(("ask", "refusal"), REFUSALS, ids=[r[1].split(" ")[0] for r in REFUSALS])
def test_each_deployment_refuses_each_untrusted_parameter_before_parsing_anything(flow_name, ask, refusal,
                                                                                  monkeypatch):
    """The flow's own function (what a deployment run calls) is refused before the params file is read or a
    model is loaded: ``load_config`` and the flow body are never reached for a path or preset refusal."""
    from flows import trust
    from flows.sft import sft_flow
    from flows.train_loop import train_loop

    monkeypatch.chdir(ROOT)
    monkeypatch.delenv(ALLOWED_ROOTS, raising=False)
    monkeypatch.delenv(ALLOW_REMOTE_CODE, raising=False)
    monkeypatch.setattr(trust, "deployment_run", lambda: True)
    parsed = []
    if "params" in ask or "preset" in ask:  # refused before any file is parsed
        monkeypatch.setattr(trust, "load_config", lambda *a, **k: parsed.append(a))
    kwargs = {"params": None, "preset": ["cpu-small"], "overrides": [], **ask}
    f = {"train-loop": train_loop, "sft": sft_flow}[flow_name]
    with pytest.raises(UntrustedParameters, match=re.escape(refusal)):
        f.fn(**kwargs)
    assert not parsed


@pytest.mark.unit
def test_the_worker_own_tracking_and_local_folders_pass_the_gate(tmp_path, monkeypatch):
    from flows.trust import check_flow_arguments

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv(ALLOWED_ROOTS, str(tmp_path))
    check_flow_arguments({"params": "params.yaml", "preset": ["cpu-small"], "overrides": []})
    check_flow_arguments({"params": None, "preset": ["cpu-small"],
                          "overrides": [f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'm.db'}",
                                        f"tracking.mlflow_artifact_location={tmp_path / 'art'}",
                                        "eval.panel=data/panels/rooms8-band.json"]})
    check_flow_arguments({"outs": [str(tmp_path / "a")], "tracking_uri": "sqlite:///mlflow.db", "export": None})
    with pytest.raises(UntrustedParameters, match=r"(?s)outs\[0\]=/etc is outside.*tracking_uri=http"):
        check_flow_arguments({"outs": ["/etc"], "tracking_uri": "http://203.0.113.7"})
