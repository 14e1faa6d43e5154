import os

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry from test servers


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
