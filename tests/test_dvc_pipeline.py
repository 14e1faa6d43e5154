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


def test_no_params_value_reaches_a_shell_through_a_stage_command():
    """DVC runs each cmd through a shell: a params.yaml value spliced into one (``${experiments.scale}``,
    ``${item.name}``) would be shell code. The matrix stages pass their quoted stage name instead."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        assert "${" not in stage["cmd"], name
    for name in ("ablation-train", "ablation-eval"):
        assert stages[name]["cmd"].endswith('--stage "$DVC_STAGE"'), name


@pytest.mark.parametrize("cmd", ["train", "eval"])
def test_a_stage_name_that_is_no_grid_run_is_refused(cmd, tmp_path):
    ragen = str(Path(sys.executable).with_name("ragen"))
    params = tmp_path / "params.yaml"
    params.write_text("experiments:\n  scale: cpu-small\n  seeds: [0]\n  run: [granularity-1]\n")
    out = subprocess.run([ragen, "grid", cmd, "--params", str(params), "--stage", "ablation-train@x; touch pwned-0"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode != 0 and "is not one run of the grid" in out.stderr and "granularity-1-0" in out.stderr
    assert not (tmp_path / "pwned-0").exists()
