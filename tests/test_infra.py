"""The scale-out recipes in infra/ are consistent with the code they deploy: every Prefect deployment's entrypoint
is a flow that takes its parameters, every job variable it sets is declared by its pool's job template, and every
placeholder of a template is declared (the process pool itself is exercised by test_deployment)."""

import importlib
import inspect
import json
import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PREFECT = ROOT / "infra" / "prefect"
TEMPLATES = {"ragen-docker": "docker-job-template.json", "ragen-k8s": "k8s-job-template.json"}


def deployments():
    return yaml.safe_load((PREFECT / "prefect.yaml").read_text())["deployments"]


@pytest.mark.parametrize("dep", deployments(), ids=lambda d: d["name"])
def test_deployment_entrypoint_is_a_flow_taking_its_parameters(dep):
    path, _, name = dep["entrypoint"].partition(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    flow = getattr(module, name)
    assert flow.name in ("ragen", "ragen-sft")
    accepted = set(inspect.signature(flow.fn).parameters)
    assert set(dep["parameters"]) <= accepted, set(dep["parameters"]) - accepted
    pool = dep["work_pool"]["name"]
    if pool in TEMPLATES:
        declared = json.loads((PREFECT / TEMPLATES[pool]).read_text())["variables"]["properties"]
        assert set(dep["work_pool"]["job_variables"]) <= set(declared)
    else:
        assert pool == "ragen-process"


@pytest.mark.parametrize("name", sorted(TEMPLATES.values()))
def test_job_template_placeholders_are_declared(name):
    t = json.loads((PREFECT / name).read_text())
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", json.dumps(t["job_configuration"])))
    assert used <= set(t["variables"]["properties"]), used - set(t["variables"]["properties"])
    assert t["variables"]["properties"]["image"]["default"] == "ragen-pipeline:latest"


def test_k8s_template_asks_for_gpus_shared_memory_and_a_runs_volume():
    t = json.loads((PREFECT / "k8s-job-template.json").read_text())
    pod = t["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpu_count }}"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "persistentVolumeClaim" in vols[mounts["/opt/ragen/runs"]]
