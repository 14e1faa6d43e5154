"""The training loop as plain calls on the tiny model (HF engine, DeepSpeed ZeRO-0): the run directory it writes,
and that a run stopped after an iteration and continued ends exactly where an uninterrupted run does."""

import json

import pytest
import torch
from safetensors.torch import load_file

from ragen.config import load_config
from ragen.models import TINY_MODEL
from ragen.run.iteration import best_iteration
from ragen.run.loop import run_training
from ragen.run.rundir import ResumeError

pytestmark = pytest.mark.integration

TINY = [f"model.base={TINY_MODEL}", "model.dtype=fp32", "rollout.engine=hf", "envs.train.tags=[SimpleSokoban]",
        "envs.train.n_groups=[2]", "envs.train.group_size=4", "envs.val.tags=[SimpleSokoban]", "envs.val.n_groups=[4]",
        "envs.val.group_size=1", "agent.max_turn=2", "rollout.response_length=12", "algorithm.filter_ratio=1.0",
        "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4", "actor.lr=1e-3", "critic.lr=1e-3",
        "actor.gradient_checkpointing=false", "critic.gradient_checkpointing=false", "trainer.test_freq=1",
        "trainer.checkpoint_every=5", "rollout.sync_mean_tol=1e-3", "rollout.sync_max_tol=1e-2",
        # the random tiny model scores most groups alike: keep them (the original) so the actor steps every update
        "algorithm.zero_variance_groups=keep"]


def cfg(tmp_path, steps, *extra):
    return load_config(None, ["cpu-small"],
                       [*TINY, f"trainer.run_dir={tmp_path}", f"trainer.total_training_steps={steps}", *extra])


def weights(run, k):
    return load_file(str(run.state(k) / "actor" / "model.safetensors"))


def test_loop_writes_each_iteration_and_resumes_exactly(tmp_path):
    full = run_training(cfg(tmp_path, 2), "full")
    run = full.run
    assert full.iterations == [0, 1] and full.eval_init is not None
    for k in (0, 1):
        d = run.iteration(k)
        for f in ("instances.parquet", "rollouts.parquet", "metrics.json", "eval.json", "COMPLETE"):
            assert (d / f).is_file(), (k, f)
        m = json.loads((d / "metrics.json").read_text())
        assert {"actor/pg_loss", "critic/vf_loss", "train/SimpleSokoban/success", "val/score",
                "timing_s/iteration"} <= set(m)
    # retention at checkpoint_every=5: only the latest and the best (by val score) states remain
    assert {k for k in (0, 1) if run.state(k).is_dir()} == {1, best_iteration(run)}

    # every checkpoint kept, the resume state with the latest only (without the collapse guard, which needs them
    # all): the resume reads iteration 0's whole, which iteration 1's completion then strips to its actor; the
    # computation is the same (compared with `full` below, whose idle guard changes nothing)
    latest = ("trainer.checkpoint_every=1", "trainer.resume_state=latest", "guard.enabled=false")
    first = run_training(cfg(tmp_path, 1, *latest), "split")  # as if killed after iteration 0 completed
    assert first.iterations == [0]
    rest = run_training(cfg(tmp_path, 2, *latest), "split")
    assert rest.iterations == [1] and rest.eval_init is None
    parts = {k: sorted(p.name for p in rest.run.state(k).iterdir() if p.is_dir()) for k in (0, 1)}
    assert parts == {0: ["actor"], 1: ["actor", "critic", "deepspeed"]}
    for key in ("train/SimpleSokoban/score", "actor/pg_loss", "critic/vf_loss", "val/score"):
        assert rest.metrics[1][key] == pytest.approx(full.metrics[1][key], rel=1e-5, abs=1e-7), key
    a, b = weights(run, 1), weights(rest.run, 1)
    assert all(torch.allclose(a[n], b[n], atol=1e-6) for n in a)
    assert run_training(cfg(tmp_path, 2, *latest), "split").iterations == []  # nothing left to do

    with pytest.raises(ResumeError, match=r"actor\.lr"):
        run_training(cfg(tmp_path, 3, *latest, "actor.lr=0.1"), "split")

    # a damaged resume checkpoint: the error names the file, how to restore it, and the last good iteration
    kept = run_training(cfg(tmp_path, 2, "trainer.checkpoint_every=1"), "damaged").run  # keeps both checkpoints
    st = kept.state(1) / "actor" / "model.safetensors"
    st.write_bytes(st.read_bytes()[:1000])  # truncated, e.g. a full disk while copying it back
    with pytest.raises(ResumeError) as e:
        run_training(cfg(tmp_path, 3, "trainer.checkpoint_every=1"), "damaged")
    msg = str(e.value)
    assert "checkpoints/iter_00001" in msg and "cannot be loaded" in msg and "last good iteration is 0" in msg
