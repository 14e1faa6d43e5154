"""Checking DVC's stored objects by their content: every object in the local cache and in a filesystem remote is
named by the md5 of its bytes (``files/md5/ab/cdef...``, ``.dir`` listings too), so a damaged copy (bit rot, a bad
copy, a file edited in place through a hardlink) is found by hashing it, and repaired from the other copy when that
one is good. DVC itself trusts both stores once written."""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Verified:
    checked: int = 0  # objects hashed (each copy counts once)
    restored_cache: list[str] = field(default_factory=list)  # damaged in the cache, copied back from the remote
    restored_remote: list[str] = field(default_factory=list)  # damaged on the remote, copied back from the cache
    lost: list[str] = field(default_factory=list)  # damaged with no good copy left
    leftovers: list[str] = field(default_factory=list)  # temporary files of an interrupted transfer (not objects)
    unchecked: str | None = None  # why the remote was not checked (not a filesystem remote)

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def _objects(db: Path) -> dict[str, Path]:
    """hash -> path of every object under a ``files/md5`` folder (DVC writes each to a hidden ``.<random>.tmp``
    beside it first, then renames it: those are not objects)."""
    out = {}
    if db.is_dir():
        for f in db.glob("??/*"):
            if f.is_file() and not f.name.startswith("."):
                out[f.parent.name + f.name.removesuffix(".dir")] = f
    return out


def _leftovers(db: Path | None) -> list[str]:
    return sorted(str(f) for f in db.glob("??/.*") if f.is_file()) if db is not None and db.is_dir() else []


def _good(path: Path, md5: str) -> bool:
    h = hashlib.md5()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest() == md5


def _replace(src: Path, dst: Path) -> None:
    """A fresh copy of ``src`` at ``dst`` (a new inode: a workspace file hardlinked to the damaged one keeps its
    damage until ``dvc checkout --force`` relinks it), read-only like DVC's own objects."""
    tmp = dst.with_name(dst.name + ".repair.tmp")
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o444)
    os.replace(tmp, dst)


def verify_objects(root: str | Path, remote: str | None = None, *, repair: bool = True) -> Verified:
    """Hash every object of the DVC repository at ``root``'s cache and of its remote (``remote`` or the default);
    with ``repair``, replace each damaged copy by the good one."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        cache = Path(repo.cache.local.path)
        r = repo.cloud.get_remote(remote)
        local_remote = r.fs.protocol == "local"
        remote_db = Path(repo.cloud.get_remote_odb(remote).path) if local_remote else None
    out = Verified(unchecked=None if local_remote else f"remote {r.name!r} is not a filesystem remote")
    in_cache, on_remote = _objects(cache), _objects(remote_db) if remote_db else {}
    out.leftovers = _leftovers(cache) + _leftovers(remote_db)
    for md5 in sorted(in_cache.keys() | on_remote.keys()):
        c, rm = in_cache.get(md5), on_remote.get(md5)
        c_ok = _good(c, md5) if c else None
        r_ok = _good(rm, md5) if rm else None
        out.checked += (c is not None) + (rm is not None)
        if c_ok is False:
            if r_ok:
                if repair:
                    _replace(rm, c)
                out.restored_cache.append(md5)
            else:
                out.lost.append(md5)
        if r_ok is False:
            if c_ok:
                if repair:
                    _replace(c, rm)
                out.restored_remote.append(md5)
            elif c_ok is None:
                out.lost.append(md5)
    return out


def differs_from_pointer(path: Path, cache: Path) -> list[str] | None:
    """The files of a DVC-added file or folder whose bytes no longer match what its ``.dvc`` pointer recorded (a
    missing file counts), relative to ``path``; None when it has no pointer, or the folder's listing is not in the
    DVC ``cache`` (``files/md5``) to compare with (the cache was cleared or garbage-collected)."""
    import json

    import yaml

    from ragen.run.rundir import RunDir

    pointer = RunDir.pointer(path)
    if not pointer.is_file():
        return None
    md5 = (yaml.safe_load(pointer.read_text()) or {}).get("outs", [{}])[0].get("md5", "")
    if not md5.endswith(".dir"):  # a single file
        return [] if path.is_file() and _good(path, md5) else [path.name]
    listing = cache / md5[:2] / md5[2:]
    if not listing.is_file() or not _good(listing, md5.removesuffix(".dir")):
        return None
    entries = json.loads(listing.read_text())
    return [e["relpath"] for e in entries
            if not (path / e["relpath"]).is_file() or not _good(path / e["relpath"], e["md5"])]
