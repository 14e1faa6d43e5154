"""DVC versioning of checkpoints: every versioned checkpoint holds the actor; the resume state (critic, optimizer
and engine state) goes to DVC with the run's last checkpoint only, unless tracking.dvc_resume_state says every
one. Real DVC on a scratch repository; the checkpoints are small files laid out as Trainer.save writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragen.config import load_config
from ragen.run.rundir import MARKER, STATE_MARKER, RunDir
from ragen.train.trainer import check_resume_state

pytestmark = pytest.mark.integration

PARTS = ("actor/model.safetensors", "critic/model.safetensors", "critic/value_head.safetensors",
         "deepspeed/actor/optim_states.pt", "deepspeed/critic/optim_states.pt", STATE_MARKER)


def fake_run(root: Path, iterations: int) -> RunDir:
    """A run whose every iteration completed and kept its checkpoint, each file's bytes unique to it."""
    run = RunDir(root / "runs" / "r")
    for k in range(iterations):
        run.iteration(k).mkdir(parents=True)
        (run.iteration(k) / "metrics.json").write_text(json.dumps({"k": k}))
        (run.iteration(k) / MARKER).write_text("{}")
        for part in PARTS:
            p = run.state(k) / part
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f"{part} of iteration {k}\n")
    return run


def versioned_files(run: RunDir, k: int, repo: Path) -> set[str]:
    """The relative paths inside iteration k's checkpoint that its DVC pointer lists (from the cache's .dir)."""
    import yaml

    out = yaml.safe_load(run.pointer(run.state(k)).read_text())["outs"][0]
    digest = out["md5"]
    listing = json.loads((repo / ".dvc" / "cache" / "files" / "md5" / digest[:2] / digest[2:]).read_text())
    return {e["relpath"] for e in listing}


@pytest.mark.parametrize("mode", ["last", "every_checkpoint"])
def test_only_the_last_checkpoint_carries_the_resume_state_to_dvc(dvc_repo, mode):
    from tasks import versioning

    run = fake_run(dvc_repo, 10)
    cfg = load_config(None, [], ["trainer.total_training_steps=10", "trainer.checkpoint_every=5",
                                 f"tracking.dvc_resume_state={mode}"])
    for k in range(10):
        versioning.version(cfg, run, k, 9)
    assert [k for k in range(10) if run.is_versioned(run.state(k))] == [4, 9]
    everything = set(PARTS)
    assert versioned_files(run, 9, dvc_repo) == everything
    assert versioned_files(run, 4, dvc_repo) == (everything if mode == "every_checkpoint" else
                                                 {"actor/model.safetensors", STATE_MARKER})
    # the run directory keeps the resume state whatever DVC holds, and DVC sees the workspace as versioned
    assert all((run.state(4) / p).is_file() for p in PARTS)
    assert versioning.status(run) == {}

    # a checkout of the actor-only checkpoint restores what was versioned, and resuming from it is a clear error
    import shutil
    import subprocess
    import sys

    shutil.rmtree(run.state(4))
    dvc = str(Path(sys.executable).with_name("dvc"))
    subprocess.run([dvc, "checkout", str(run.pointer(run.state(4)))], cwd=dvc_repo, check=True, capture_output=True)
    assert (run.state(4) / "actor" / "model.safetensors").read_text() == "actor/model.safetensors of iteration 4\n"
    if mode == "last":
        assert not (run.state(4) / "deepspeed").exists()
        with pytest.raises(FileNotFoundError, match=r"no critic/ or deepspeed/ .*tracking\.dvc_resume_state=last"):
            check_resume_state(run.state(4), critic=True)
    else:
        check_resume_state(run.state(4), critic=True)
    check_resume_state(run.state(9), critic=True)
