"""The push deadline's pause (tasks/versioning.push_with_deadline): after a push times out, pushes to that remote
are skipped for STALL_PAUSE_FACTOR x the deadline, then tried again; a push that works ends the pause. The child
process and its kill run for real in tests/faults/test_dvc_remote_hang.py."""

import pytest

import tasks.dvc_push
from tasks import versioning
from tasks.versioning import STALL_PAUSE_FACTOR, PushStalled, push_with_deadline

pytestmark = pytest.mark.unit


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(versioning.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(versioning, "_stalled", {})
    return now


def test_a_timed_out_push_pauses_pushes_to_that_remote_then_tries_again(clock, monkeypatch, tmp_path):
    calls = []

    def push(root, targets, remote, timeout_s):
        calls.append(remote)
        if remote == "web" and len(calls) == 1:
            raise tasks.dvc_push.PushTimeout("the DVC push to remote web did not finish within 5 s")
        return len(targets)

    monkeypatch.setattr(tasks.dvc_push, "push", push)
    with pytest.raises(PushStalled, match=r"did not finish within 5 s: the remote is not answering.*after 50 s"):
        push_with_deadline(tmp_path, ["a.dvc"], "web", 5.0)
    clock[0] += 49.0  # within the pause (10 x 5 s): skipped, the remote is not asked
    with pytest.raises(PushStalled, match=r"push skipped: .*pause for another 1 s"):
        push_with_deadline(tmp_path, ["a.dvc"], "web", 5.0)
    assert calls == ["web"]
    assert push_with_deadline(tmp_path, ["a.dvc"], "other", 5.0) == 1  # another remote is not paused
    clock[0] += 1.0  # the pause is over: tried again, and a push that works ends the pause
    assert push_with_deadline(tmp_path, ["a.dvc", "b.dvc"], "web", 5.0) == 2
    assert versioning._stalled == {} and calls == ["web", "other", "web"]
    assert STALL_PAUSE_FACTOR == 10


def test_a_paused_push_is_not_retried_by_the_task_other_failures_are():
    class State:
        def __init__(self, e):
            self.e = e

        def result(self, raise_on_failure):
            assert raise_on_failure is False
            return self.e

    assert versioning._worth_retrying(None, None, State(PushStalled("push skipped"))) is False
    assert versioning._worth_retrying(None, None, State(RuntimeError("dvc push failed: No space left"))) is True


def test_a_failed_push_is_told_by_dvcs_own_error_lines():
    from tasks.dvc_push import _reason

    err = ("Collecting\nERROR: failed to transfer 'md5: 0b12' - [Errno 28] No space left on device\n"
           "ERROR: failed to transfer 'md5: 5c34' - [Errno 28] No space left on device\n"
           "UploadError: 2 files failed to upload\n")
    assert _reason(err) == ("ERROR: failed to transfer 'md5: 0b12' - [Errno 28] No space left on device; "
                            "ERROR: failed to transfer 'md5: 5c34' - [Errno 28] No space left on device; "
                            "UploadError: 2 files failed to upload")
    assert _reason("") == ""
