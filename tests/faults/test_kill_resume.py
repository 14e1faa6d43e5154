"""SIGKILL in the middle of a rollout, of an update, in iteration 0 and inside a checkpoint write (tiny model, HF
engine, plain calls): each rerun of the same command continues after the last completed iteration, the completed
iterations are untouched, and the run ends with exactly the metrics and weights of an uninterrupted run with the
same seed."""

import os
import signal
import subprocess
import time

import pytest
from ledger import declares
from uninterrupted import ROOT, assert_same_final, train_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
ENV = dict(os.environ, PYTHONUNBUFFERED="1")


def kill_when(cmd, ready, what):
    """Start ``cmd``, SIGKILL it as soon as the file or folder ``ready`` exists (polled every 10 ms)."""
    p = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while not ready.exists():
        assert p.poll() is None, f"the run ended before {what}"
        assert time.monotonic() - t0 < 900, f"no {ready} after 900 s"
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    assert p.wait() == -signal.SIGKILL


@declares("SIGKILL during rollout", "SIGKILL during update", "SIGKILL in iteration 0",
          "SIGKILL inside a checkpoint write")
def test_sigkill_during_rollout_and_update_then_rerun_equals_uninterrupted(tmp_path, reference_run, fault):
    during_rollout, during_update = fault("SIGKILL during rollout"), fault("SIGKILL during update")
    in_ckpt = fault("SIGKILL inside a checkpoint write")
    run = tmp_path / "killed"
    # one run, killed four times, each rerun the same command: first in iteration 0 (nothing complete yet)
    fault("SIGKILL in iteration 0")  # nothing complete to guard: the proof is the final equality below
    kill_when(train_command(tmp_path, "killed"), run / "iter_00000" / "instances.parquet", "iteration 0's rollout")
    assert not (run / "iter_00000" / "COMPLETE").exists()
    # then in iteration 1's rollout (instances.parquet is written just before it starts)
    kill_when(train_command(tmp_path, "killed"), run / "iter_00001" / "instances.parquet", "iteration 1's rollout")
    assert (run / "iter_00000" / "COMPLETE").is_file() and not (run / "iter_00001" / "rollouts.parquet").exists()
    assert during_rollout.guard(run) >= 5  # iteration 0's files
    # the rerun recomputes iteration 1; this time it dies in the update (filter.json comes right before it)
    kill_when(train_command(tmp_path, "killed"), run / "iter_00001" / "filter.json", "iteration 1's update")
    assert not (run / "iter_00001" / "COMPLETE").is_file()
    during_update.guard(run)
    # and once more inside the checkpoint write of iteration 1: the actor's folder appears as its files start to
    # be written; the optimizer states follow
    partial = run / "checkpoints" / "iter_00001.partial"
    kill_when(train_command(tmp_path, "killed"), partial / "actor", "iteration 1's checkpoint write")
    assert not (run / "checkpoints" / "iter_00001").exists() and not (run / "iter_00001" / "COMPLETE").exists()
    in_ckpt.guard(run)  # iteration 0, complete

    again = subprocess.run(train_command(tmp_path, "killed"), cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "completed iterations 1..1" in again.stdout and not partial.exists()  # the half-written one is gone
    assert during_rollout.lost_now() == [] and during_update.lost_now() == [] and in_ckpt.lost_now() == []
    assert_same_final(run, reference_run)
