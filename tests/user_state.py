"""What the test session must leave as it found it (tests/conftest.py checks it at the session's end): the
project's MLflow store, run folders and DVC remote, the user's own Prefect home, and no server left listening."""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import re
from pathlib import Path

from listening import listening, socket_owners

_REMOTE = re.compile(r"""^'?remote\s+"(?P<name>[^"]+)"'?$""")  # DVC writes ['remote "name"'] (quotes kept)


def dvc_remote_dirs(root: Path) -> list[Path]:
    """The local folders the project's DVC remotes point at (.dvc/config and .dvc/config.local; URLs with a scheme
    are not on this machine)."""
    cfg = configparser.ConfigParser()
    cfg.read([root / ".dvc" / "config", root / ".dvc" / "config.local"])
    dirs = []
    for section in cfg.sections():
        url = cfg[section].get("url", "").strip().strip("'\"")
        if _REMOTE.match(section) and url and "://" not in url:
            dirs.append((root / ".dvc" / url).resolve())
    return dirs


def guarded_places(root: Path, home: Path) -> list[Path]:
    return [root / "mlflow.db", root / "mlruns", root / "mlartifacts", home / ".prefect", *dvc_remote_dirs(root)]


def user_state(root: Path, home: Path) -> dict[str, str]:
    """Each guarded file by its hash (its mtime when over 64 MiB); the run folders by name only (gigabytes, some
    training right now)."""
    runs = root / "runs"
    state = {str(r): "a run folder" for r in sorted(runs.iterdir())} if runs.is_dir() else {}
    for place in guarded_places(root, home):
        files = [place] if place.is_file() else sorted(f for f in place.rglob("*") if f.is_file()) \
            if place.is_dir() else []
        for f in files:
            if f.name.endswith((".lock", ".db-shm", ".db-wal")):  # transient, rewritten on open
                continue
            with contextlib.suppress(OSError):
                state[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest() if f.stat().st_size < 2**26 \
                    else str(f.stat().st_mtime_ns)
    return state


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return [f"changed or created by the tests: {k}"
            for k in sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))]


def new_servers(servers_before: set[int], exclude_pid: int) -> dict[int, tuple[str, int, int]]:
    """Listening sockets opened since ``servers_before`` by another process than ``exclude_pid`` (this one's go
    with it): inode -> (address, port, pid)."""
    new = {i: a for i, a in listening().items() if i not in servers_before}
    return {i: (*new[i], pid) for i, pid in socket_owners(set(new)).items() if pid != exclude_pid}


def server_problems(servers: dict[int, tuple[str, int, int]]) -> list[str]:
    problems = []
    for addr, port, pid in servers.values():
        cmdline = Path(f"/proc/{pid}/cmdline")
        cmd = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200] if cmdline.exists() else "?"
        problems.append(f"left listening on {addr}:{port}: pid {pid} ({cmd})")
    return problems
