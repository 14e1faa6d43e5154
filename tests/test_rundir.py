"""The run directory: where a restarted run continues, config binding, the checkpoint retention rule."""

import os

import pytest

from ragen.config import load_config
from ragen.run.retention import prune_states, retained_states, states_to_version
from ragen.run.rundir import STATE_MARKER, ResumeError, RunBusyError, RunDir
from ragen.run.storage import storage_failure

pytestmark = pytest.mark.unit


def complete(run, k, state=True):
    run.iteration(k).mkdir(parents=True, exist_ok=True)
    if state:
        run.state(k).mkdir(parents=True)
        (run.state(k) / STATE_MARKER).write_text("done")
    run.mark_complete(k, {"iteration": k})


def test_a_fresh_run_starts_at_zero_and_resumes_after_the_last_marker(tmp_path):
    run = RunDir.at(tmp_path, "r")
    assert run.next_iteration() == 0 and run.resume_state() is None
    complete(run, 0)
    complete(run, 1)
    run.iteration(2).mkdir()  # killed mid-iteration: data but no marker
    (run.iteration(2) / "rollouts.parquet").write_text("half")
    assert run.completed() == [0, 1]
    assert run.next_iteration() == 2
    assert run.resume_state() == run.state(1)


def test_holes_and_missing_states_are_named(tmp_path):
    run = RunDir.at(tmp_path, "r")
    complete(run, 0)
    complete(run, 2)
    with pytest.raises(ResumeError, match=r"iterations \[1\]"):
        run.next_iteration()
    run2 = RunDir.at(tmp_path, "s")
    complete(run2, 0, state=False)
    with pytest.raises(ResumeError, match=r"checkpoints/iter_00000 is missing.*no earlier checkpoint"):
        run2.resume_state()


def test_an_incomplete_checkpoint_names_the_file_and_the_last_good_iteration(tmp_path):
    run = RunDir.at(tmp_path, "r")
    complete(run, 0)
    complete(run, 1)
    (run.state(1) / STATE_MARKER).unlink()  # e.g. killed while copying it back by hand
    with pytest.raises(ResumeError) as e:
        run.resume_state()
    msg = str(e.value)
    assert "checkpoints/iter_00001 is incomplete" in msg and "last good iteration is 0" in msg
    assert "not DVC-versioned" in msg
    run.pointer(run.state(1)).write_text("outs: []\n")
    with pytest.raises(ResumeError, match=r"dvc checkout .*checkpoints/iter_00001\.dvc"):
        run.resume_state()


def test_the_trainer_writes_the_marker_the_run_dir_checks():
    from ragen.train.trainer import COMPLETE

    assert COMPLETE == STATE_MARKER


def test_bad_run_names_are_refused(tmp_path):
    for bad in ("", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="run name"):
            RunDir.at(tmp_path, bad)


def test_a_restart_with_other_settings_names_the_keys(tmp_path):
    run = RunDir.at(tmp_path, "r")
    run.bind_config(load_config(None, ["cpu-small"]))
    run.bind_config(load_config(None, ["cpu-small"], ["trainer.total_training_steps=99"]))  # longer run: fine
    with pytest.raises(ResumeError, match=r"actor\.lr: 1e-06 -> 0\.5|actor\.lr: .* -> 0\.5"):
        run.bind_config(load_config(None, ["cpu-small"], ["actor.lr=0.5"]))


def test_a_restart_with_a_custom_tag_setting_is_the_same_run(tmp_path):
    """envs.custom defaults to {}: the restart of a run that set it (the granularity ablations do) must not see
    the empty default as a changed key; changing the setting still must."""
    run = RunDir.at(tmp_path, "r")
    custom = "envs.custom={SimpleSokoban: {max_actions_per_traj: 15}}"
    run.bind_config(load_config(None, ["cpu-small"], [custom]))
    run.bind_config(load_config(None, ["cpu-small"], [custom]))
    with pytest.raises(ResumeError, match=r"envs\.custom\.SimpleSokoban\.max_actions_per_traj: 15 -> 20"):
        run.bind_config(load_config(None, ["cpu-small"], [custom.replace("15", "20")]))
    with pytest.raises(ResumeError, match=r"envs\.custom"):
        run.bind_config(load_config(None, ["cpu-small"]))


def test_retention_keeps_latest_best_and_every_nth(tmp_path):
    assert retained_states([], 2, None) == set()
    assert retained_states(list(range(7)), 3, best=0) == {0, 2, 5, 6}
    run = RunDir.at(tmp_path, "r")
    for k in range(5):
        complete(run, k)
    assert prune_states(run, 2, best=2) == [0]
    assert [k for k in range(5) if run.state(k).is_dir()] == [1, 2, 3, 4]
    run.pointer(run.state(2)).write_text("outs: []\n")  # versioned: kept even when no longer the best
    assert prune_states(run, 2, best=None) == []


def test_checkpoints_to_version_are_every_nth_the_last_and_each_new_best():
    assert [k for k in range(7) if states_to_version(k, 3, last=6, best=None)] == [2, 5, 6]
    assert states_to_version(0, 3, last=6, best=0) and not states_to_version(1, 3, last=6, best=0)


def test_config_name_changes_with_the_data_settings_only():
    from ragen.run.identity import config_name

    a = config_name(load_config(None, ["cpu-small"]))
    assert a.startswith("p-") and a == config_name(load_config(None, ["cpu-small"]))
    assert a == config_name(load_config(None, ["cpu-small"], ["trainer.total_training_steps=99", "tracking.dvc=false"]))
    assert a != config_name(load_config(None, ["cpu-small"], ["actor.lr=0.5"]))


def test_a_run_directory_is_held_by_one_process(tmp_path):
    import subprocess
    import sys

    run = RunDir.at(tmp_path, "r")
    hold = ("import sys, time; from ragen.run.rundir import RunDir\n"
            "with RunDir.at(sys.argv[1], 'r').locked():\n    print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        busy = rf"is being trained by pid {p.pid}; wait for it .* another --run"
        with pytest.raises(RunBusyError, match=busy), run.locked():
            pass
    finally:
        p.kill()
        p.wait()
    with run.locked(), run.locked():  # free again once the holder died; reentrant within a process
        assert (run.root / ".lock").read_text().strip() == f"pid {os.getpid()}"
    with run.locked():
        pass


def test_storage_failures_say_what_is_intact_and_how_to_resume(tmp_path):
    import errno

    run = RunDir.at(tmp_path, "r")
    complete(run, 0)
    complete(run, 1)
    msg = storage_failure(run, OSError(errno.ENOSPC, "No space left on device", str(run.iteration(2) / "x")))
    assert "No space left on device" in msg and "iterations 0..1 are complete and intact" in msg
    assert "it resumes at iteration 2" in msg and str(run.iteration(2) / "x") in msg
    assert storage_failure(run, OSError(errno.ECONNREFUSED, "refused")) is None
    from safetensors import SafetensorError  # its writer reports a full disk in words, not as an OSError

    msg = storage_failure(run, SafetensorError("Error while serializing: I/O error: No space left on device (os "
                                               "error 28)"))
    assert msg is not None and "SafetensorError" in msg and "it resumes at iteration 2" in msg
    assert storage_failure(run, ValueError("not storage")) is None


def test_an_io_error_that_also_hides_the_run_directory_is_still_explained(tmp_path, monkeypatch):
    import errno

    run = RunDir.at(tmp_path, "r")
    eio = OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(RunDir, "completed", lambda self: (_ for _ in ()).throw(eio))
    msg = storage_failure(run, OSError(errno.EIO, "Input/output error", str(run.iteration(1) / "x")))
    assert "Input/output error" in msg and "cannot be read now" in msg and "dmesg" in msg
    assert "resumes after the last iteration that reached the disk complete" in msg


def test_an_iteration_reaches_the_disk_before_its_marker(tmp_path, monkeypatch):
    """The commit point is durable: every file of the iteration (and the run's own files) is fsync'd before the
    COMPLETE marker is written, and the marker and the folders holding it after."""
    import os

    run = RunDir.at(tmp_path, "r")
    d = run.iteration(0)
    (d / "sub").mkdir(parents=True)
    for p in (d / "metrics.json", d / "sub" / "rollouts.parquet", run.root / "config.yaml"):
        p.write_text("x")
    synced: list[str] = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    run.mark_complete(0, {"k": 0})
    marker = synced.index(str(d / "COMPLETE.tmp"))  # written beside, fsync'd, renamed over
    before = set(synced[:marker])
    assert {str(d / "metrics.json"), str(d / "sub" / "rollouts.parquet"), str(d / "sub"), str(d),
            str(run.root / "config.yaml")} <= before
    assert synced[marker + 1:] == [str(d), str(run.root), str(tmp_path)]  # the names: marker, iteration, run
    assert run.completed() == [0]


def test_a_damaged_metrics_file_is_named_with_its_restore(tmp_path):
    run = RunDir.at(tmp_path, "r")
    complete(run, 0)
    (run.iteration(0) / "metrics.json").write_text('{"val/sc')
    with pytest.raises(ResumeError, match=r"metrics\.json is damaged .*not DVC-versioned"):
        run.metrics(0)
    run.pointer(run.iteration(0)).write_text("outs: []\n")
    with pytest.raises(ResumeError, match=r"dvc checkout .*iter_00000\.dvc"):
        run.metrics(0)
