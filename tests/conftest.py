import os
import tempfile
import time
from pathlib import Path

import ledger
import pytest
from listening import listening
from user_state import changed, new_servers, server_problems, user_state
from worker_groups import share_cores, xdist_group

from servers.local import prefect_home_env  # imports no prefect

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry from test servers
# The tests never touch the user's Prefect: every client, server and subprocess of the session gets a temporary
# Prefect home (set before anything imports prefect), and no test reaches a server the user has running.
os.environ.update(prefect_home_env(Path(tempfile.mkdtemp(prefix="ragen-tests-prefect-"))))
os.environ.pop("PREFECT_API_URL", None)
share_cores(os.environ)  # before anything imports torch (tests/worker_groups.py)
ROOT = Path(__file__).resolve().parents[1]
# the project whose state the session guards (tests/test_user_state.py points a session of its own elsewhere)
GUARDED_ROOT = Path(os.environ.get("RAGEN_TESTS_GUARDED_ROOT", ROOT))

TIERS = ("unit", "integration", "faults")
FAULTS_DIR = Path(__file__).resolve().parent / "faults"


def xdist_worker(config) -> bool:
    """This process is a pytest-xdist worker (the controller, or a plain session, sees the whole session)."""
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: the faults tier comes from the directory
def pytest_collection_modifyitems(config, items):
    """Every test belongs to exactly one tier (pyproject.toml's markers): `make test-fast` runs the unit tier, so
    a test without a tier would silently run only in the full suite."""
    wrong = []
    for item in items:
        if FAULTS_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.faults)
        group = xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
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
def one_process_run(tmp_path_factory):
    """The one-process run a 2-rank launch must equal (test_launcher.py's settings, 2 iterations); shared by the
    launcher tests and the rank faults. Returns its RunDir."""
    from test_launcher import EXACT
    from test_loop import TINY

    from ragen.config import load_config
    from ragen.run.loop import run_training

    root = tmp_path_factory.mktemp("one-process")
    return run_training(load_config(None, ["cpu-small"], [*TINY, *EXACT, f"trainer.run_dir={root}",
                                                          "trainer.total_training_steps=2"]), "one").run


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


def pytest_configure(config):
    ledger.register(config)  # the fault ledger (tests/ledger.py): on an xdist controller it merges the workers'


def pytest_sessionstart(session):
    if xdist_worker(session.config):
        return  # the controller guards the whole session: a worker would see the other's servers as leaked
    session.config._user_state = user_state(GUARDED_ROOT, Path.home())
    session.config._servers = set(listening())


def pytest_sessionfinish(session, exitstatus):
    """Fail the session when the tests changed the user's state or left a server listening (fixtures are torn
    down by now; a server this process holds itself goes with it, one in another process would stay)."""
    before = getattr(session.config, "_user_state", None)
    if before is None:
        return
    problems = changed(before, user_state(GUARDED_ROOT, Path.home()))[:20]
    deadline = time.monotonic() + 15
    while True:  # a server stopped at teardown may take a moment to close its socket
        servers = new_servers(session.config._servers, os.getpid())
        if not servers or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    problems += server_problems(servers)
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "the tests did not leave the user's state alone", red=True)
            for line in problems:
                reporter.write_line(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
