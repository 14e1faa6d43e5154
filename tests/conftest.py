import os
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry from test servers

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
