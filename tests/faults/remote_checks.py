"""What the DVC fault tests read back after a fault: the run's recorded tracking failures, what the remote lacks,
and whether each object on a folder remote hashes to its name."""

import hashlib
import json
from pathlib import Path


def failures(run):
    """The run's tracking-failures.jsonl records, in order."""
    path = run.root / "tracking-failures.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def on_remote(repo, run):
    """`dvc status --cloud` of every pointer of the run: {} when the remote has everything."""
    from dvc.repo import Repo

    from tasks.versioning import pointers

    with Repo(str(repo)) as r:
        return r.status(targets=[str(p) for p in pointers(run)], cloud=True)


def remote_objects(remote: Path) -> list[Path]:
    """The objects of a folder remote (``files/md5/ab/cdef...``, ``.dir`` listings too); DVC's hidden upload temps
    (``.<random>.tmp``, which no pointer names) left out."""
    return [f for f in (remote / "files" / "md5").rglob("*") if f.is_file() and not f.name.startswith(".")]


def misnamed(objects: list[Path]) -> list[Path]:
    """Objects whose bytes do not hash to their name (a half-written or damaged copy)."""
    return [f for f in objects
            if hashlib.md5(f.read_bytes()).hexdigest() != f.parent.name + f.name.removesuffix(".dir")]
