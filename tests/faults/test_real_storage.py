"""The run directory on a real small file system (mounted for the test; root with CAP_SYS_ADMIN, else skipped):
- a tmpfs too small for the run's checkpoints at the start (refused before anything is written), then shrunk
  during iteration 1 until it no longer fits (a real ENOSPC from the kernel), then remounted read-only (a real
  EROFS);
- an ext4 file system on a loop device, shut down mid-iteration without flushing its journal (the kernel's
  EXT4_IOC_SHUTDOWN, as xfstests' godown does): every later read and write gets a real EIO, and what is on the
  device is what a power cut would leave. Mounted with a 300 s journal commit interval, so that only what the run
  itself made durable (fsync) survives.
Each time `ragen train` stops with exit 1 naming the failed write; the completed iterations are intact, and the
same command then finishes the run with exactly the metrics and weights of an uninterrupted one."""

import fcntl
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from filesystems import remount, tmpfs, used
from ledger import declares
from typer.testing import CliRunner
from uninterrupted import assert_same_final, train_command

from cli.main import app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture
def small_fs(tmp_path):
    with tmpfs(tmp_path / "fs") as mnt:
        yield mnt


def train_args(run_dir, iterations):
    """``ragen train`` of the reference's settings (a checkpoint each iteration, so each can resume), minus the
    executable, for ``iterations`` of its 2."""
    return train_command(run_dir, "r", "trainer.checkpoint_every=1", iterations=iterations)[1:]


def train(run_dir, iterations):
    return CliRunner().invoke(app, train_args(run_dir, iterations))


def shrink_once_started(mnt, ready):
    """A thread that shrinks the file system at ``mnt`` to what it holds plus 4 MiB as soon as ``ready`` exists:
    the disk fills up mid-run, after the start's disk check has passed (iteration 1's checkpoint no longer fits)."""
    def shrink():
        t0 = time.monotonic()
        while not ready.exists() and time.monotonic() - t0 < 600:
            time.sleep(0.01)
        remount(mnt, f"size={used(mnt) + 4 * 2**20}")

    t = threading.Thread(target=shrink, daemon=True)
    t.start()
    return t


@declares("disk full (a real tmpfs)", "read-only file system (a real remount)")
def test_a_full_then_read_only_file_system_then_room_again(small_fs, reference_run, fault):
    full, read_only = fault("disk full (a real tmpfs)"), fault("read-only file system (a real remount)")
    assert train(small_fs, 1).exit_code == 0
    full.guard(small_fs / "r")
    # a disk already too small for the run's checkpoints: refused at the start, naming the numbers
    remount(small_fs, f"size={used(small_fs) + 4 * 2**20}")
    r = train(small_fs, 2)
    assert r.exit_code == 2 and "at their peak" in r.output and "trainer.resume_state=latest" in r.output, r.output
    assert full.lost_now() == []
    # room at the start, then the disk fills up during iteration 1 (a real ENOSPC from the kernel)
    remount(small_fs, "size=2g")
    shrinking = shrink_once_started(small_fs, small_fs / "r" / "iter_00001" / "instances.parquet")
    r = train(small_fs, 2)
    shrinking.join()
    assert r.exit_code == 1, r.output
    assert "No space left on device" in r.output and "iterations 0..0 are complete and intact" in r.output
    assert "it resumes at iteration 1" in r.output
    assert full.lost_now() == []

    read_only.guard(small_fs / "r")
    remount(small_fs, "size=2g")
    remount(small_fs, "ro")
    r = train(small_fs, 2)
    assert r.exit_code == 1, r.output
    assert "Read-only file system" in r.output and "iterations 0..0 are complete and intact" in r.output

    remount(small_fs, "rw,size=2g")  # room again: the same command carries on
    r = train(small_fs, 2)
    assert r.exit_code == 0 and "completed iterations 1..1" in r.output, r.output
    assert full.lost_now() == [] and read_only.lost_now() == []
    assert_same_final(small_fs / "r", reference_run)


@pytest.fixture
def ext4(tmp_path):
    """An ext4 file system in a 512 MiB sparse file, loop-mounted; yields its mount point and a remount."""
    img, mnt = tmp_path / "disk.img", tmp_path / "ext4"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(512 * 2**20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True, capture_output=True)

    def mount():
        return subprocess.run(["mount", "-o", "loop,commit=300", str(img), str(mnt)], capture_output=True, text=True)

    r = mount()
    if r.returncode:
        pytest.skip(f"cannot loop-mount an ext4 image here ({r.stderr.strip()}): needs root with loop devices")
    yield mnt, mount
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def shut_down(mnt):
    """EXT4_IOC_SHUTDOWN with EXT4_GOING_FLAGS_NOLOGFLUSH: nothing more reaches the device, every access is EIO."""
    fd = os.open(mnt, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, 0x8004587D, struct.pack("I", 2))
    finally:
        os.close(fd)


@declares("I/O errors then a power cut (ext4 shut down without a journal flush)")
def test_a_power_cut_mid_iteration_keeps_every_completed_iteration(ext4, reference_run, fault):
    cut = fault("I/O errors then a power cut (ext4 shut down without a journal flush)")
    mnt, mount = ext4
    run = mnt / "r"
    p = subprocess.Popen([str(Path(sys.executable).with_name("ragen")), *train_args(mnt, 2)], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    ready, t0 = run / "iter_00001" / "filter.json", time.monotonic()  # iteration 0 complete, 1 about to update
    while not ready.is_file():
        assert p.poll() is None, f"the run ended before iteration 1's update: {p.stderr.read()[-3000:]}"
        assert time.monotonic() - t0 < 600, f"no {ready} after 600 s"
        time.sleep(0.01)
    state = run / "checkpoints" / "iter_00000"
    cut.guard(run, *[f for f in state.rglob("*") if f.is_file()])
    shut_down(mnt)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1, err[-3000:]
    assert "Input/output error" in err and "dmesg" in err, err[-3000:]

    subprocess.run(["umount", str(mnt)], check=True, capture_output=True)
    r = mount()  # the journal replays: the device as a power cut would have left it
    assert r.returncode == 0, r.stderr
    assert cut.lost_now() == []  # iteration 0 and its checkpoint, byte for byte
    r = train(mnt, 2)
    assert r.exit_code == 0 and "completed iterations 1..1" in r.output, r.output
    assert_same_final(mnt / "r", reference_run)
