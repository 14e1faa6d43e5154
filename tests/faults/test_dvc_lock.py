"""DVC's one-command-per-repository lock held by another process (a real `dvc` lock on a temporary repo): versioning
waits for it and then succeeds, and past its timeout it gives up with an error naming the repository and what
happens next (versioning catches up after the next iteration), instead of breaking the lock or hanging."""

import subprocess
import sys
import time

import pytest
from ledger import declares

from tasks.versioning import VersioningError, when_unlocked

HOLD = """
import sys, time
from dvc.repo import Repo
repo = Repo(sys.argv[1])
with repo.lock:
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold_lock(repo, seconds):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(repo), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def add(repo, name):
    from dvc.repo import Repo

    (repo / name).write_text(name)

    def fn():
        with Repo(str(repo)) as r:
            r.add([str(repo / name)])
        return name

    return fn


@declares("DVC repository locked by another process (wait, then time out)")
def test_dvc_lock_contention_is_waited_for_then_times_out_with_a_clear_error(dvc_repo, fault):
    fault("DVC repository locked by another process (wait, then time out)")
    holder = hold_lock(dvc_repo, 4)
    t0 = time.monotonic()
    assert when_unlocked(dvc_repo, add(dvc_repo, "a.txt"), wait_s=60) == "a.txt"
    assert time.monotonic() - t0 >= 2 and (dvc_repo / "a.txt.dvc").is_file()  # it waited for the holder
    holder.wait(timeout=60)

    holder = hold_lock(dvc_repo, 60)
    try:
        t0 = time.monotonic()
        with pytest.raises(VersioningError, match=r"stayed locked for 3 s.*catches up after the next iteration"):
            when_unlocked(dvc_repo, add(dvc_repo, "b.txt"), wait_s=3)
        assert 3 <= time.monotonic() - t0 < 20
        assert not (dvc_repo / "b.txt.dvc").exists() and holder.poll() is None  # the holder's lock was not broken
    finally:
        holder.kill()
        holder.wait()
    assert when_unlocked(dvc_repo, add(dvc_repo, "b.txt"), wait_s=60) == "b.txt"  # free again: it goes through
