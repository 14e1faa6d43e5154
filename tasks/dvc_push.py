"""`dvc push` with a deadline: a remote that stops answering (a hung ssh or HTTP server, a stuck network mount)
must not stall training. The push runs in a child process that is killed at the deadline (and with its parent,
so a killed run leaves no push behind holding the repo's lock); what it did not send stays committed in the local
DVC cache, and a later push sends it.

Run as ``python -m tasks.dvc_push ROOT REMOTE TARGET...`` it is that child: it pushes and prints the count."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

LOCKED = 3  # the child's exit status when another DVC command holds the repo
_PR_SET_PDEATHSIG = 1


class PushTimeout(TimeoutError):
    """The remote did not take the push within the deadline; the child was killed."""


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (Linux; elsewhere the push outlives a killed run)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def push(root: Path, targets: list[str], remote: str | None, timeout_s: float) -> int:
    """Push ``targets`` (DVC pointer files) of the repo at ``root``; returns how many files were sent. Raises
    ``dvc.lock.LockError`` when another DVC command holds the repo, ``PushTimeout`` past ``timeout_s``, and
    ``RuntimeError`` with DVC's own message on any other failure."""
    from dvc.lock import LockError

    cmd = [sys.executable, "-m", "tasks.dvc_push", str(root), remote or "", *targets]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_die_with_parent)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # stuck inside the kernel: it goes when that returns
            proc.communicate(timeout=10)
        raise PushTimeout(f"the DVC push to remote {remote or '(the default)'} did not finish within "
                          f"tracking.dvc_push_timeout_s={timeout_s:g} s and was stopped") from None
    if proc.returncode == LOCKED:
        raise LockError(err.strip().splitlines()[-1] if err.strip() else "the DVC repository is locked")
    if proc.returncode != 0:
        raise RuntimeError(f"dvc push failed: {_reason(err) or f'exit status {proc.returncode}'}")
    return int(json.loads(out.strip().splitlines()[-1])["pushed"])


def _reason(stderr: str) -> str:
    """DVC's own error lines (the per-file causes: "No space left on device", ...) and the child's last word."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    found = [ln for ln in lines if ln.startswith("ERROR")][:3]
    if lines and lines[-1] not in found:
        found.append(lines[-1])
    return "; ".join(found)


def main(argv: list[str]) -> int:
    from dvc.lock import LockError
    from dvc.repo import Repo

    root, remote, targets = argv[0], argv[1] or None, argv[2:]
    try:
        with Repo(root) as repo:
            pushed = repo.push(targets=targets, remote=remote)
    except LockError as e:
        print(e, file=sys.stderr)
        return LOCKED
    except Exception as e:  # one line for the run's failure record; DVC logged the per-file causes above it
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"pushed": int(pushed or 0)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
