"""Real small file systems for the fault tests: a tmpfs mounted over a folder (root with CAP_SYS_ADMIN, else the
test is skipped), remounted smaller or read-only to make the kernel itself fail writes."""

import contextlib
import functools
import os
import subprocess
import tempfile

import pytest


@contextlib.contextmanager
def tmpfs(mnt, size="2g"):
    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): needs root with CAP_SYS_ADMIN")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@functools.cache
def tmpfs_mountable() -> bool:
    """Whether this machine lets the tests mount a tmpfs (tried once: a 1 MiB one in a temporary folder)."""
    with tempfile.TemporaryDirectory() as d:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d], capture_output=True).returncode:
            return False
        subprocess.run(["umount", "-l", d], capture_output=True)
        return True


def remount(mnt, opts):
    subprocess.run(["mount", "-o", f"remount,{opts}", str(mnt)], check=True, capture_output=True)


def used(mnt):
    """Bytes in use on the file system mounted at ``mnt``."""
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize
