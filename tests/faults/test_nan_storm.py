"""A NaN/inf storm over several iterations (tiny model, plain loop, collapse guard on): every actor loss of two
iterations in a row is NaN. Each such step is skipped (the weights stay finite, no checkpoint is poisoned), the guard
counts the iterations that trained nothing and rolls the run back with halved learning rates (to the base model:
iteration 1's non-finite gradients were taken on checkpoint 0's policy), archiving what it rolled back byte for
byte, and the run then finishes with finite weights that moved."""

import dataclasses
import hashlib
import json

import pytest
import torch
from ledger import declares
from safetensors.torch import load_file
from test_loop import TINY

from ragen.config import load_config
from ragen.run import guard
from ragen.run.loop import run_training
from ragen.run.rundir import RunDir
from ragen.train import update

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def finite_weights(path):
    w = load_file(str(path / "actor" / "model.safetensors"))
    return w, all(bool(torch.isfinite(t).all()) for t in w.values())


@declares(("NaN/inf storm over several iterations", "simulated"))
def test_a_nan_storm_is_skipped_then_rolled_back(tmp_path, monkeypatch, fault):
    # the policy loss is made NaN (simulated); nothing is guarded by path: the rollback moves iteration 0 into its
    # archive, where it is compared byte for byte with `before`
    fault("NaN/inf storm over several iterations")
    cfg = load_config(None, ["cpu-small"], [
        *TINY, f"trainer.run_dir={tmp_path}", "trainer.total_training_steps=3", "trainer.checkpoint_every=1",
        "trainer.val_before_train=false", "trainer.test_freq=100", "guard.enabled=true",
        "guard.signals=[grad_spike]", "guard.patience=2", "guard.max_rollbacks=1"])
    real = update.policy_terms
    raging = {"on": False, "started": False}

    def nan_terms(*args, **kwargs):
        t = real(*args, **kwargs)
        return dataclasses.replace(t, loss_mat=t.loss_mat * float("nan")) if raging["on"] else t

    monkeypatch.setattr(update, "policy_terms", nan_terms)
    run = RunDir(tmp_path / "s")

    before = {}

    def after(k, metrics):
        if k == 0 and not raging["started"]:  # iteration 0 trained normally: snapshot it, then the storm starts
            before.update({f.relative_to(run.root): hashlib.sha256(f.read_bytes()).hexdigest()
                           for f in run.iteration(0).rglob("*") if f.is_file()})
            raging["on"] = raging["started"] = True

    def rolled_back(event):
        raging["on"] = False  # the storm passes once the guard has acted

    res = run_training(cfg, "s", on_iteration=after, on_rollback=rolled_back)
    (event,) = res.rollbacks
    assert (event.at, event.to, event.signals, event.lr_factor) == (2, -1, ["nonfinite_steps"], 0.5)
    archived = run.root / event.archived
    # every file of iteration 0 is in the archive unchanged (its completion marker renamed, so it never counts)
    moved = {f: f.with_name(f.name + ".rolled-back") if f.name == "COMPLETE" else f for f in before}
    assert before and {f: hashlib.sha256((archived / moved[f]).read_bytes()).hexdigest() for f in before} == before
    for k in (1, 2):  # the storm's iterations: every actor step skipped, and their checkpoints are not poisoned
        m = json.loads((archived / f"iter_{k:05d}" / "metrics.json").read_text())
        assert m["actor/skipped"] == 1.0, k
        assert finite_weights(archived / f"checkpoint_{k:05d}")[1], k
    assert res.iterations == [0, 1, 2, 0, 1, 2] and run.completed() == [0, 1, 2]
    (w0, ok0), (w2, ok2) = finite_weights(run.state(0)), finite_weights(run.state(2))
    assert ok0 and ok2 and any(not torch.equal(w0[n], w2[n]) for n in w0)  # trained on after the storm
    assert run.metrics(2)["actor/skipped"] == 0.0
    assert guard.GuardState.read(run).rollbacks[0].signals == ["nonfinite_steps"]
