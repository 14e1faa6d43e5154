"""A run's checkpoints on disk: the bytes of one checkpoint and the peak over a run against hand-computed values,
the resume state kept with the latest checkpoint only (trainer.resume_state=latest), and a start refused on a disk
too small for the run."""

from collections import namedtuple

import pytest

from ragen.config import load_config
from ragen.run import disk
from ragen.run.disk import DiskTooSmall, check_disk, checkpoint_parts, disk_plan
from ragen.run.retention import prune_states
from ragen.run.rundir import STATE_MARKER, RunDir

pytestmark = pytest.mark.unit
N = 1000  # parameters of a made-up model


def cfg(*over):
    return load_config(None, ["paper"], list(over))


def test_one_checkpoint_by_hand():
    # bf16, ZeRO-2, PPO: actor files 2N; resume state = actor optimizer 12N + critic files 2N + its optimizer 12N
    assert checkpoint_parts(cfg(), N) == (2 * N, 26 * N)
    # fp32 (ZeRO-0's config): 4 bytes a weight, Adam's moments 8: actor optimizer 8N + critic files 4N + its 8N
    z0 = ("actor.deepspeed_config=infra/deepspeed/zero0.json", "critic.deepspeed_config=infra/deepspeed/zero0.json")
    assert checkpoint_parts(cfg(*z0), N) == (4 * N, 20 * N)
    # ZeRO-3 also saves the module's weights in DeepSpeed's state: 2N more per engine
    z3 = ("actor.deepspeed_config=infra/deepspeed/zero3.json", "critic.deepspeed_config=infra/deepspeed/zero3.json")
    assert checkpoint_parts(cfg(*z3), N) == (2 * N, 30 * N)
    # GRPO: no critic
    assert checkpoint_parts(cfg("algorithm.adv_estimator=grpo"), N) == (2 * N, 12 * N)
    # LoRA: the adapters (fp32 files, 12 bytes of optimizer each) instead of the weights
    assert checkpoint_parts(cfg("model.lora_rank=8"), N, lora_params=10) == (40, 2 * (12 * 10) + 40)


def test_the_peak_over_a_run_by_hand():
    # 5 iterations, every 2nd kept: while iteration 4 is written, 3 (the latest) and 1 are kept, and a best among
    # the dropped 0 and 2 may be kept too: the partial 4, 3, 1 and the best = 4 whole checkpoints
    p = disk_plan(cfg("trainer.total_training_steps=5", "trainer.checkpoint_every=2",
                      "trainer.resume_state=every_checkpoint"), N)
    assert p.checkpoint == 28 * N and p.kept_at_peak == 4 and p.peak == 4 * 28 * N
    # the resume state with the latest only: the partial and the latest whole, the other two the actor's 2N
    p = disk_plan(cfg("trainer.total_training_steps=5", "trainer.checkpoint_every=2"), N)
    assert p.resume_state_kept == "latest" and p.peak == 2 * 28 * N + 2 * 2 * N
    # a one-iteration run: its one checkpoint, being written
    assert disk_plan(cfg("trainer.total_training_steps=1"), N).peak == 28 * N


def test_the_paper_preset_fits_a_64_gib_disk():
    qwen05 = 494_032_768  # Qwen2.5-0.5B (tests/test_memory.py counts it)
    p = disk_plan(cfg(), qwen05)
    assert p.resume_state_kept == "latest" and p.kept_at_peak == 6
    # while iteration 199 is written: 198 and 199 whole; 49, 99, 149 and a best, the actor alone
    assert p.peak == pytest.approx(2 * 28 * qwen05 + 4 * 2 * qwen05) and p.peak / 2**30 < 30
    assert disk_plan(cfg("trainer.resume_state=every_checkpoint"), qwen05).peak / 2**30 > 64  # as it was


def checkpoint(run, k, *parts):
    run.iteration(k).mkdir(parents=True, exist_ok=True)
    for part in ("actor", *parts):
        (run.state(k) / part).mkdir(parents=True)
        (run.state(k) / part / "w.bin").write_bytes(b"x")
    (run.state(k) / STATE_MARKER).write_text("done")
    run.mark_complete(k, {"iteration": k})


def test_the_resume_state_stays_with_the_latest_checkpoint_only(tmp_path):
    run = RunDir.at(tmp_path, "r")
    for k in range(4):
        checkpoint(run, k, "critic", "deepspeed")
    assert prune_states(run, 2, best=0, resume_state="latest") == [2]
    parts = {k: sorted(p.name for p in run.state(k).iterdir() if p.is_dir()) for k in (0, 1, 3)}
    assert parts == {0: ["actor"], 1: ["actor"], 3: ["actor", "critic", "deepspeed"]}
    # a LoRA checkpoint's critic adapters are resume state too; a pointer covering the resume state keeps it
    run2 = RunDir.at(tmp_path, "lora")
    for k in range(3):
        checkpoint(run2, k, "adapters/critic", "deepspeed")
    run2.pointer(run2.state(0)).write_text("outs: []\n")
    prune_states(run2, 1, best=None, resume_state="latest")
    assert (run2.state(0) / "deepspeed").is_dir() and (run2.state(0) / "adapters" / "critic").is_dir()
    assert not (run2.state(1) / "deepspeed").exists() and not (run2.state(1) / "adapters" / "critic").exists()
    # ... unless the run's .dvcignore left it out of the pointer (tracking.dvc_resume_state=last)
    (run2.root / ".dvcignore").write_text("/checkpoints/iter_00000/adapters/critic/\n"
                                          "/checkpoints/iter_00000/deepspeed/\n")
    prune_states(run2, 1, best=None, resume_state="latest")
    assert not (run2.state(0) / "deepspeed").exists() and (run2.state(0) / "actor").is_dir()
    assert (run2.state(2) / "deepspeed").is_dir()  # the latest
    # every_checkpoint (the default) strips nothing
    run3 = RunDir.at(tmp_path, "all")
    for k in range(3):
        checkpoint(run3, k, "critic", "deepspeed")
    prune_states(run3, 1, best=None)
    assert all((run3.state(k) / "deepspeed").is_dir() for k in range(3))


def test_the_collapse_guard_needs_every_resume_state():
    with pytest.raises(ValueError, match=r"guard\.enabled=true needs trainer\.resume_state=every_checkpoint"):
        cfg("guard.enabled=true")


def test_a_disk_too_small_for_the_run_is_refused_with_the_numbers(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: usage(64 * 2**30, 0, 20 * 10**9))
    with pytest.raises(DiskTooSmall, match=r"need 31\.6 GB at their peak \(6 checkpoints of 13\.83 GB, 12\.84 GB "
                                           r"of it resume state\) but .* has 20\.0 GB free.*trainer\.resume_state"):
        check_disk(cfg(), tmp_path / "runs" / "r")
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: usage(64 * 2**30, 0, 40 * 10**9))
    assert check_disk(cfg(), tmp_path / "runs" / "r").peak < 40e9


def test_bench_memory_prints_the_disk_plan_with_the_memory_plan():
    import json

    from typer.testing import CliRunner

    from cli.main import app

    r = CliRunner().invoke(app, ["bench", "memory", "--preset", "paper", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["disk"]["peak"] == pytest.approx(64 * rep["parameters"])  # 2 x 28 + 4 x 2 bytes a parameter
    assert rep["disk"]["kept_at_peak"] == 6 and rep["disk"]["resume_state_kept"] == "latest"
    text = CliRunner().invoke(app, ["bench", "memory", "--preset", "paper"]).output
    assert "31.6 GB at the peak (6 checkpoints; computed)" in text
