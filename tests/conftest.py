import contextlib
import hashlib
import os
import tempfile
import time
from pathlib import Path

import pytest
from listening import listening, socket_owners

from tasks.services import prefect_home_env  # imports no prefect

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry from test servers
# The tests never touch the user's Prefect: every client, server and subprocess of the session gets a temporary
# Prefect home (set before anything imports prefect), and no test reaches a server the user has running.
os.environ.update(prefect_home_env(Path(tempfile.mkdtemp(prefix="ragen-tests-prefect-"))))
os.environ.pop("PREFECT_API_URL", None)
ROOT = Path(__file__).resolve().parents[1]

TIERS = ("unit", "integration", "faults")
FAULTS_DIR = Path(__file__).resolve().parent / "faults"


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: the faults tier comes from the directory
def pytest_collection_modifyitems(config, items):
    """Every test belongs to exactly one tier (pyproject.toml's markers): `make test-fast` runs the unit tier, so
    a test without a tier would silently run only in the full suite."""
    wrong = []
    for item in items:
        if FAULTS_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.faults)
        tiers = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
        if len(tiers) != 1:
            wrong.append(f"{item.nodeid}: {', '.join(tiers) or 'no tier'}")
    if wrong:
        raise pytest.UsageError("each test needs exactly one tier marker (@pytest.mark.unit or "
                                "@pytest.mark.integration; tests/faults/ are the faults tier):\n  "
                                + "\n  ".join(wrong))


@pytest.fixture(scope="session")
def prefect_api():
    """One temporary Prefect API server (sqlite) for the whole session: the flows of every test run against it
    (a server per module cost ~20 s each). Yields its URL, for subprocesses that should use it too."""
    import prefect.settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield prefect.settings.PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def tokenizer():
    from ragen.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def renderer(tokenizer):
    from ragen.agent.chat import ChatRenderer

    return ChatRenderer(tokenizer)


@pytest.fixture
def dvc_repo(tmp_path):
    """A git + DVC repository with a local default remote outside it, set up as the project's own (.dvc/config)."""
    from tasks.versioning import init_repo

    init_repo(tmp_path / "repo", tmp_path / "remote")
    return tmp_path / "repo"


def _user_state() -> dict[str, str]:
    """What the tests must leave as they found it: the project's MLflow store and run folder, its DVC remote, the
    user's own Prefect home (each file by size and hash; folders by their listing)."""
    import configparser

    places = [ROOT / "mlflow.db", ROOT / "mlruns", ROOT / "mlartifacts", Path.home() / ".prefect"]
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".dvc" / "config")
    places += [(ROOT / ".dvc" / cfg[s]["url"]).resolve() for s in cfg.sections()
               if s.startswith("remote") and "://" not in cfg[s].get("url", "://")]
    runs = ROOT / "runs"  # the user's runs (gigabytes, some training right now): which ones exist, not their bytes
    state = {str(r): "a run folder" for r in sorted(runs.iterdir())} if runs.is_dir() else {}
    for place in places:
        files = [place] if place.is_file() else sorted(f for f in place.rglob("*") if f.is_file()) \
            if place.is_dir() else []
        for f in files:
            if f.name.endswith((".lock", ".db-shm", ".db-wal")):  # transient, rewritten on open
                continue
            with contextlib.suppress(OSError):
                state[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest() if f.stat().st_size < 2**26 \
                    else str(f.stat().st_mtime_ns)
    return state


def pytest_sessionstart(session):
    session.config._user_state = _user_state()
    session.config._servers = set(listening())


def pytest_sessionfinish(session, exitstatus):
    """Fail the session when the tests changed the user's state or left a server listening (fixtures are torn
    down by now; a server this process holds itself goes with it, one in another process would stay)."""
    before = getattr(session.config, "_user_state", None)
    if before is None:
        return
    after = _user_state()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    deadline = time.monotonic() + 15
    while True:  # a server stopped at teardown may take a moment to close its socket
        new = {i: a for i, a in listening().items() if i not in session.config._servers}
        owners = {i: pid for i, pid in socket_owners(set(new)).items() if pid != os.getpid()}
        if not owners or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    problems = [f"changed or created by the tests: {k}" for k in changed[:20]]
    for inode, pid in owners.items():
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200] \
            if Path(f"/proc/{pid}/cmdline").exists() else "?"
        problems.append(f"left listening on {new[inode][0]}:{new[inode][1]}: pid {pid} ({cmd})")
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "the tests did not leave the user's state alone", red=True)
            for line in problems:
                reporter.write_line(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
