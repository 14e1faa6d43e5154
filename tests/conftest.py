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
    import subprocess
    import sys
    from pathlib import Path

    root, remote = tmp_path / "repo", tmp_path / "remote"
    root.mkdir()
    dvc = [str(Path(sys.executable).with_name("dvc"))]
    for cmd in (["git", "init", "-q"], [*dvc, "init", "-q"], [*dvc, "remote", "add", "-d", "local", str(remote)],
                [*dvc, "config", "cache.type", "hardlink,symlink,copy"], [*dvc, "config", "core.analytics", "false"]):
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)
    return root
