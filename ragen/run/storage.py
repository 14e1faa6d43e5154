"""Errors of a run directory's storage (disk full, quota, read-only, I/O) rather than of the program: the run stops
with what failed, what is intact and how to go on."""

from __future__ import annotations

import errno
import os

from ragen.run.rundir import RunDir

# errors of a run directory's storage rather than of the program: the run stops with what to fix
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}


# how libraries that do their own I/O (safetensors' Rust writer, pyarrow) word the same errors
STORAGE_WORDS = tuple(os.strerror(n) for n in sorted(STORAGE_ERRNOS - {errno.EACCES, errno.EPERM}))


def storage_failure(run: RunDir, e: BaseException) -> str | None:
    """The message for a training run stopped by its storage (disk full, quota, read-only, I/O error), or None
    for any other error: what failed, and that the completed iterations are intact and a rerun resumes."""
    if isinstance(e, OSError):
        if e.errno not in STORAGE_ERRNOS:
            return None
    elif not any(w in str(e) for w in STORAGE_WORDS):  # e.g. SafetensorError "... No space left on device"
        return None
    else:
        e = OSError(next(n for n in STORAGE_ERRNOS if os.strerror(n) in str(e)), f"{type(e).__name__}: {e}")
    done = run.completed()
    kept = (f"iterations 0..{done[-1]} are complete and intact" if done else "no iteration had completed")
    where = f" ({e.filename})" if e.filename else ""
    return (f"run {run.root}: a write failed{where}: {e.strerror or e}; {kept}. Free space or fix the "
            f"permissions of {run.root}, then run the same command again: it resumes at iteration "
            f"{len(done)}")
