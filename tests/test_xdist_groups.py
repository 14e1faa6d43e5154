"""`make test` runs the suite on two pytest-xdist workers with `--dist loadgroup` and relies on the groups
tests/conftest.py sets: the tests of one module-scoped fixture (or one trained session run) share a worker, so it
is built once. Some pytest and xdist versions ignore the groups without a word (pytest-dev/pytest-xdist#1386):
this runs a planted suite under the suite's own rule (tests/worker_groups.py) and sees the fixture built once."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]

PLANTED = '''
import os
import pytest


@pytest.fixture(scope="module")
def built_once():
    with open(os.environ["BUILT_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")


@pytest.mark.parametrize("i", range(6))
def test_shares_the_fixture(built_once, i):
    pass


@pytest.mark.parametrize("i", range(12))
def test_other(i):
    pass
'''


def test_the_tests_of_a_module_fixture_share_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "import sys\nimport pytest\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "from worker_groups import xdist_group as group_of\n\n\n"
        "@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        "        if group_of(item):\n"
        "            item.add_marker(pytest.mark.xdist_group(group_of(item)))\n")
    (tmp_path / "test_planted.py").write_text(PLANTED)
    log = tmp_path / "built.log"
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
                        "loadgroup", "-v", str(tmp_path)], cwd=tmp_path, env={**os.environ, "BUILT_LOG": str(log)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "test_shares_the_fixture[0]@test_planted.py::built_once" in r.stdout, r.stdout[-3000:]
    assert len(log.read_text().split()) == 1, "the module fixture was built on both workers: the groups are ignored"


def test_each_worker_takes_its_share_of_the_cores():
    from worker_groups import share_cores

    cores = len(os.sched_getaffinity(0))
    env = {"PYTEST_XDIST_WORKER_COUNT": "2"}
    assert share_cores(env) == max(1, cores // 2) and env["OMP_NUM_THREADS"] == str(max(1, cores // 2))
    assert share_cores({"PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "3"}) is None  # the caller's kept
    assert share_cores({}) is None and share_cores({"PYTEST_XDIST_WORKER_COUNT": "1"}) is None
