"""Damaged DVC objects (a temporary git + DVC repo and its local remote, real `dvc add` + `dvc push`): a cache
object rotted in place (the hardlinked workspace file with it) and a remote object overwritten are found by
hashing them with `ragen runs verify`, each is restored from the other copy, and `dvc checkout --force` then brings
the workspace file back byte for byte; an object damaged in both stores is reported as lost (exit 1)."""

import subprocess
import sys
from pathlib import Path

from damage import flip
from ledger import declares
from typer.testing import CliRunner

from cli.main import app
from tasks.dvc_verify import verify_objects

DVC = str(Path(sys.executable).with_name("dvc"))


def dvc(repo, *args):
    r = subprocess.run([DVC, *args], cwd=repo, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


@declares("corrupted DVC cache object", "corrupted DVC remote object")
def test_damaged_cache_and_remote_objects_are_found_and_restored(dvc_repo, tmp_path, fault):
    cache_fault, remote_fault = fault("corrupted DVC cache object"), fault("corrupted DVC remote object")
    data = dvc_repo / "data"
    data.mkdir()
    for name in ("a.bin", "b.bin", "c.bin"):
        (data / name).write_bytes(name.encode() * 5000)
    dvc(dvc_repo, "add", "data")
    dvc(dvc_repo, "push")
    cache, remote = dvc_repo / ".dvc" / "cache" / "files" / "md5", tmp_path / "remote" / "files" / "md5"

    def obj(db, content):
        import hashlib

        md5 = hashlib.md5(content).hexdigest()
        return db / md5[:2] / md5[2:]

    a, b = obj(cache, b"a.bin" * 5000), obj(remote, b"b.bin" * 5000)
    # what must not be lost: the other store's copy each repair restores from, read before any repair
    cache_fault.guard(obj(remote, b"a.bin" * 5000))
    remote_fault.guard(obj(cache, b"b.bin" * 5000))
    flip(a)  # the workspace's a.bin is a hardlink to it: damaged too
    flip(b)
    assert cache_fault.lost_now() == [] and remote_fault.lost_now() == []
    # 3 files + the .dir listing, in both stores; --check-only changes nothing
    assert verify_objects(dvc_repo, repair=False).to_dict() == {
        "checked": 8, "restored_cache": [a.parent.name + a.name], "restored_remote": [b.parent.name + b.name],
        "lost": [], "leftovers": [], "unchecked": None}
    r = CliRunner().invoke(app, ["runs", "verify", "--repo", str(dvc_repo), "--json"])
    assert r.exit_code == 0, r.output
    assert verify_objects(dvc_repo).to_dict()["restored_cache"] == []  # both stores whole again
    assert (data / "a.bin").read_bytes() != b"a.bin" * 5000  # the hardlinked workspace copy: until checkout
    dvc(dvc_repo, "checkout", "--force", "data.dvc")
    assert [(data / n).read_bytes() for n in ("a.bin", "b.bin")] == [b"a.bin" * 5000, b"b.bin" * 5000]

    flip(obj(cache, b"c.bin" * 5000))  # the same object in both stores: no good copy left
    flip(obj(remote, b"c.bin" * 5000))
    r = CliRunner().invoke(app, ["runs", "verify", "--repo", str(dvc_repo)])
    assert r.exit_code == 1 and "no good copy" in r.output
