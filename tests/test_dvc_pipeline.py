"""The project's DVC set-up: a DVC repo whose default remote lies outside the work tree, `dvc.yaml` stages wired
to params.yaml and to CLI options that exist, and the prepare-model stage's manifest."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
DVC = str(Path(sys.executable).with_name("dvc"))


def test_default_remote_is_local_and_outside_the_work_tree():
    r = subprocess.run([DVC, "remote", "list"], cwd=ROOT, capture_output=True, text=True, check=True)
    name, url = r.stdout.split()[:2]
    default = subprocess.run([DVC, "config", "core.remote"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert default.stdout.strip() == name
    remote = (ROOT / ".dvc" / url).resolve() if not Path(url).is_absolute() else Path(url)
    assert ROOT not in remote.parents and remote != ROOT


def test_stages_read_params_yaml_keys_and_call_real_options():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert {"prepare-model", "sft", "train"} <= set(stages)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert set(stages["train"]["params"]) <= set(params) and set(stages["sft"]["params"]) <= set(params)
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in stages["sft"]["outs"]]
    assert params["sft"]["demos"] in outs and params["sft"]["output"] in outs  # the paths the stage writes
    listed = subprocess.run([DVC, "stage", "list"], cwd=ROOT, capture_output=True, text=True)
    assert listed.returncode == 0 and "prepare-model" in listed.stdout and "train" in listed.stdout
    ragen = str(Path(sys.executable).with_name("ragen"))
    for stage, flag in (("prepare-model", "--manifest"), ("sft", "--summary"), ("train", "--summary")):
        cmd = stages[stage]["cmd"].split()
        assert cmd[0] == "ragen" and flag in cmd
        helptext = subprocess.run([ragen, *cmd[1:cmd.index(flag)], "--help"], capture_output=True, text=True,
                                  env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        assert flag in helptext.stdout, helptext.stdout + helptext.stderr


def test_prepare_model_manifest_hashes_the_weights(tmp_path):
    ragen = str(Path(sys.executable).with_name("ragen"))
    out = tmp_path / "m.json"
    subprocess.run([ragen, "models", "prepare", "--base", "tiny-random-llama", "--manifest", str(out)], check=True,
                   capture_output=True)
    m = json.loads(out.read_text())
    assert m["base"] == "tiny-random-llama" and Path(m["path"]).is_dir()
    weights = [k for k in m["sha256"] if k.endswith(".safetensors")]
    assert weights and all(len(m["sha256"][k]) == 64 for k in weights)
