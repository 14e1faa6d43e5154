"""The PostgreSQL service's own files (servers/local.py): its password file is trusted only when this user made
it (owned, 0600, not a link), and handing a data directory to the `postgres` user never follows a link out of it."""

import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from servers.local import LocalPostgres, ServiceError

pytestmark = pytest.mark.unit


def test_the_password_is_made_private_once(tmp_path):
    pg = LocalPostgres(tmp_path / "pg")
    first = pg.password
    assert len(first) >= 24 and pg.password == first
    assert pg.password_file.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_password_file_others_can_read_or_wrote_first_is_refused(tmp_path, mode):
    pg = LocalPostgres(tmp_path / "pg")
    pg.password_file.write_text("chosen-by-someone-else")
    pg.password_file.chmod(mode)
    with pytest.raises(ServiceError, match=rf"{pg.password_file} is not this user's private file .*mode "
                                           rf"{oct(mode)}.*Delete it"):
        _ = pg.password


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_password_file_another_user_owns_is_refused(tmp_path):
    pg = LocalPostgres(tmp_path / "pg")
    pg.password_file.write_text("chosen-by-someone-else")
    pg.password_file.chmod(0o600)
    os.chown(pg.password_file, 65534, 65534)  # nobody: made first by another local user
    with pytest.raises(ServiceError, match="owner uid 65534"):
        _ = pg.password


def test_a_linked_password_file_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("their password")
    target.chmod(0o600)
    pg = LocalPostgres(tmp_path / "pg")
    pg.password_file.symlink_to(target)
    with pytest.raises(ServiceError, match=r"cannot be opened safely.*plain file"):
        _ = pg.password
    assert target.read_text() == "their password"


def _postgres_user():
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return None


needs_root_and_postgres = pytest.mark.skipif(os.geteuid() != 0 or _postgres_user() is None,
                                             reason="the data directory is handed over only under root, to the "
                                                    "`postgres` system user")


@pytest.fixture
def open_dir():
    """A folder the `postgres` user can pass through (pytest's tmp_path sits under a 0700 directory)."""
    d = Path(tempfile.mkdtemp(prefix="ragen-pg-files-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@needs_root_and_postgres
def test_handing_over_the_data_directory_never_follows_a_link(open_dir):
    tmp_path = open_dir
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x")
    data = tmp_path / "pg"
    (data / "base").mkdir(parents=True)
    (data / "base" / "file").write_text("y")
    (data / "link-to-dir").symlink_to(outside)
    (data / "link-to-file").symlink_to(outside / "secret")
    LocalPostgres(data)._owned()
    pg_uid = _postgres_user().pw_uid
    assert (data / "base" / "file").stat().st_uid == pg_uid and data.stat().st_uid == pg_uid
    assert os.lstat(data / "link-to-dir").st_uid == pg_uid  # the link itself, not what it points at
    assert outside.stat().st_uid == 0 and (outside / "secret").stat().st_uid == 0


@needs_root_and_postgres
def test_a_linked_data_directory_is_refused(open_dir):
    tmp_path = open_dir
    (tmp_path / "real").mkdir()
    (tmp_path / "pg").symlink_to(tmp_path / "real")
    with pytest.raises(ServiceError, match="is a symbolic link"):
        LocalPostgres(tmp_path / "pg")._owned()
    assert (tmp_path / "real").stat().st_uid == 0
