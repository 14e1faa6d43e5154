"""The fault bench's ledger (tests/ledger.py) counts what happened: faults declared up front by
kind, a skipped or deselected one as not tried with its reason, bad inputs apart, guarded files once each."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
FAULTS = Path(__file__).resolve().parent / "faults"

PLANTED = '''
import pytest
from ledger import declares


@declares("server killed", ("writer patched to fail", "simulated"))
def test_real_and_simulated(fault, tmp_path_factory):
    shared = tmp_path_factory.getbasetemp() / "shared.bin"
    shared.write_bytes(b"x")
    killed, f = fault("server killed"), fault("writer patched to fail")
    killed.guard(shared)
    f.guard(shared)  # the same file guarded twice: counted once
    assert killed.lost_now() == [] and f.lost_now() == []


@declares(("bad input: {args}", "input"))
@pytest.mark.parametrize("args", [["--preset", "nope"], ["--set", "x=1"]])
def test_inputs(fault, args):
    fault(f"bad input: {' '.join(args)}")


@declares("needs a tmpfs")
def test_skipped(fault):
    pytest.skip("cannot mount a tmpfs here")


@declares("a slow one")
@pytest.mark.slow
def test_deselected(fault):
    pass


@declares("failed one")
def test_failed(fault):
    raise AssertionError("the pipeline lost its data")


@declares("declared")
def test_undeclared_use(fault):
    fault("not declared")
'''


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist-2"])
def test_the_ledger_counts_kinds_not_tried_and_distinct_guarded_files(tmp_path, workers):
    """The same counts from one process and from two pytest-xdist workers (`make test`), whose ledgers the
    controller merges."""
    suite = tmp_path / "faults"
    suite.mkdir()
    shutil.copy(FAULTS / "conftest.py", suite / "conftest.py")
    shutil.copy(FAULTS.parent / "ledger.py", suite / "ledger.py")
    (suite / "test_planted.py").write_text(PLANTED)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: x\n    fault_plan: x\n")
    out = tmp_path / "faults.json"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *workers,
                        str(suite)],
                       cwd=tmp_path, env={**os.environ, "RAGEN_FAULTS_JSON": str(out)}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1, r.stdout[-3000:]  # two planted failures
    s = json.loads(out.read_text())
    assert {k: s[k] for k in ("faults_tried", "real", "simulated", "input", "not_tried", "survived",
                              "inputs_refused", "data_lost", "guarded_files")} == {
        "faults_tried": 4, "real": 3, "simulated": 1, "input": 2, "not_tried": 2, "survived": 2,
        "inputs_refused": 2, "data_lost": 0, "guarded_files": 1}
    by_name = {f["name"]: f for f in s["faults"]}
    assert by_name["needs a tmpfs"]["not_tried"] == "skipped: Skipped: cannot mount a tmpfs here"
    assert by_name["a slow one"]["not_tried"] == "deselected (-m / -k)"
    assert by_name["bad input: --preset nope"]["kind"] == "input" and by_name["bad input: --set x=1"]["survived"]
    assert not by_name["failed one"]["survived"] and not by_name["declared"]["survived"]
    assert "fault 'not declared' is not declared: add it to the test's @declares" in r.stdout
    assert "faults tried 4 (3 real, 1 simulated), survived 2; bad inputs 2 (refused 2); not tried 2" in r.stdout


def test_the_workers_ledgers_merge_into_the_record_of_the_worker_that_ran_the_test():
    from ledger import NOT_RUN, merge

    def rec(name, not_tried):
        return {"test": "t.py::x", "name": name, "not_tried": not_tried}

    ran = [rec("a", None), rec("b", "skipped: no tmpfs"), rec("c", "deselected (-m / -k)")]
    idle = [rec("a", NOT_RUN), rec("b", NOT_RUN), rec("c", "deselected (-m / -k)")]
    for order in (ran + idle, idle + ran):  # whichever worker reports first
        assert sorted(merge(order), key=lambda r: r["name"]) == ran
