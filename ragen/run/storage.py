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
    where = f" ({e.filename})" if e.filename else ""
    fix = {errno.ENOSPC: f"Free space on the file system of {run.root}", errno.EDQUOT: "Raise the quota or free space",
           errno.EFBIG: "Raise the file size limit (ulimit -f)",
           errno.EIO: "The device reported an I/O error: check it (dmesg), then unmount and mount it again"
           }.get(e.errno, f"Make {run.root} writable (a read-only mount, its permissions)")
    try:
        done = run.completed()
    except OSError as unreadable:  # the same device refuses reads too (a dead disk, a file system shut down)
        return (f"run {run.root}: a write failed{where}: {e.strerror or e}, and the run directory cannot be read now "
                f"({unreadable.strerror}). {fix}; then run the same command again: it resumes after the last "
                f"iteration that reached the disk complete")
    kept = (f"iterations 0..{done[-1]} are complete and intact" if done else "no iteration had completed")
    return (f"run {run.root}: a write failed{where}: {e.strerror or e}; {kept}. {fix}, then run the same command "
            f"again: it resumes at iteration {len(done)}")
