"""Damage done to files by the fault tests, and a restore that can only come from the DVC remote."""


def flip(path):
    """Damage a file in place (same inode: a hardlinked DVC cache object with it), as bit rot or an in-place edit
    would."""
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with path.open("r+b") as f:
        f.write(bytes(data))


def pull_back_from_remote_alone(repo, run, k):
    """Drop the DVC cache and iteration ``k``'s folder, then `dvc pull` it: only the remote can give it back."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    shutil.rmtree(repo / ".dvc" / "cache")
    shutil.rmtree(run.iteration(k))
    pulled = subprocess.run([str(Path(sys.executable).with_name("dvc")), "pull", str(run.pointer(run.iteration(k)))],
                            cwd=repo, capture_output=True, text=True)
    assert pulled.returncode == 0, pulled.stderr
