"""The session's own guard (tests/conftest.py, tests/user_state.py): a pytest session that changes any guarded
store of the project (MLflow store, run folders, the DVC remote, the user's Prefect home) or leaves a server
listening fails, naming it; one that touches nothing passes."""

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from user_state import dvc_remote_dirs

TESTS = Path(__file__).resolve().parent


@pytest.mark.unit
def test_the_dvc_remote_is_read_as_dvc_writes_it(tmp_path):
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text(
        "[core]\n    remote = local\n['remote \"local\"']\n    url = ../../store\n"
        "['remote \"cloud\"']\n    url = s3://bucket/x\n")
    (tmp_path / ".dvc" / "config.local").write_text("['remote \"mine\"']\n    url = /srv/dvc\n")
    assert dvc_remote_dirs(tmp_path) == [(tmp_path / ".." / "store").resolve(), Path("/srv/dvc")]


def project(tmp_path: Path) -> tuple[Path, Path, Path]:
    root, home, remote = tmp_path / "project", tmp_path / "home", tmp_path / "remote"
    for d in (root / ".dvc", root / "mlruns" / "0", root / "mlartifacts", root / "runs" / "a", home / ".prefect",
              remote / "files"):
        d.mkdir(parents=True)
    (root / ".dvc" / "config").write_text(f"['remote \"local\"']\n    url = {os.path.relpath(remote, root / '.dvc')}\n")
    for f in (root / "mlflow.db", root / "mlruns" / "0" / "meta.yaml", root / "mlartifacts" / "model.bin",
              home / ".prefect" / "profiles.toml", remote / "files" / "ab12"):
        f.write_text("as the user left it")
    return root, home, remote


def session(tmp_path: Path, root: Path, home: Path, body: str) -> subprocess.CompletedProcess:
    """A pytest session with the project's conftest guarding ``root`` and ``home``, running one test ``body``."""
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(TESTS / "conftest.py", suite / "conftest.py")
    (suite / "test_planted.py").write_text("import pytest\n\n\n@pytest.mark.unit\ndef test_planted():\n"
                                           + textwrap.indent(textwrap.dedent(body), "    ") + "\n")
    env = {**os.environ, "RAGEN_TESTS_GUARDED_ROOT": str(root), "HOME": str(home),
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.integration  # waits out the guard's 15 s for the leaked server to close
def test_a_session_that_changes_each_guarded_store_or_leaves_a_server_fails_naming_each(tmp_path):
    root, home, remote = project(tmp_path)
    out = session(tmp_path, root, home, f"""
        import subprocess, sys, time
        from pathlib import Path
        for f in ["{root}/mlflow.db", "{root}/mlruns/0/meta.yaml", "{root}/mlartifacts/model.bin",
                  "{home}/.prefect/profiles.toml", "{remote}/files/ab12"]:
            Path(f).write_text("changed by a test")
        Path("{root}/runs/new-run").mkdir()
        server = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
                  "print('up', flush=True); time.sleep(60)")
        p = subprocess.Popen([sys.executable, "-c", server], stdout=subprocess.PIPE, start_new_session=True)
        p.stdout.readline()
        Path("{tmp_path}/leaked.pid").write_text(str(p.pid))
    """)
    try:
        assert out.returncode != 0, out.stdout[-2000:]
        assert "the tests did not leave the user's state alone" in out.stdout
        for planted in [root / "mlflow.db", root / "mlruns" / "0" / "meta.yaml", root / "mlartifacts" / "model.bin",
                        home / ".prefect" / "profiles.toml", remote / "files" / "ab12", root / "runs" / "new-run"]:
            assert f"changed or created by the tests: {planted}" in out.stdout, (planted, out.stdout[-2000:])
        pid = int((tmp_path / "leaked.pid").read_text())
        assert "left listening on 127.0.0.1:" in out.stdout and f"pid {pid}" in out.stdout
    finally:
        if (tmp_path / "leaked.pid").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / "leaked.pid").read_text()), 9)


@pytest.mark.unit
def test_a_session_that_leaves_everything_alone_passes(tmp_path):
    root, home, _ = project(tmp_path)
    out = session(tmp_path, root, home, "assert True")
    assert out.returncode == 0, out.stdout[-2000:]
    assert "did not leave the user's state alone" not in out.stdout
