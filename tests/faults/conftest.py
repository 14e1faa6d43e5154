"""The fault-injection and bad-input suite. Every case declares the faults it injects up front (``@declares``,
tests/faults/ledger.py) and takes each one from the ``fault`` fixture while it runs; a fault *survives* when its
test passes (the pipeline kept working or stopped with a clear error), and its *data lost* is what changed or
vanished among the files it guarded (the completed iterations of a run, or the versioned copies a repair restores
from), snapshotted before the fault and compared before any repair step of the test. A declared fault whose test
was skipped or deselected is counted ``not tried`` with the reason. The session prints the counts and, with
``RAGEN_FAULTS_JSON`` set (``ragen bench faults --json``), writes them there."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ledger import KINDS, planned

LEDGER: list[Fault] = []


@dataclass
class Fault:
    name: str
    test: str
    kind: str = "real"  # real | simulated | input (tests/faults/ledger.py)
    survived: bool = False
    not_tried: str | None = "its test did not run"  # None once its test ran; else why not (skipped, deselected)
    guarded: dict[str, str] = field(default_factory=dict)  # path -> sha256 of completed data before the fault
    lost: list[str] = field(default_factory=list)
    checked: bool = False

    def guard(self, *paths: Path) -> int:
        """Snapshot what must survive: the completed iterations of run directories, or single files."""
        for p in paths:
            self.guarded.update(completed_data(p) if p.is_dir() else {str(p): sha256(p)})
        return len(self.guarded)

    def lost_now(self) -> list[str]:
        """Files guarded before the fault that are now missing or different."""
        self.checked = True
        self.lost = sorted(p for p, h in self.guarded.items() if not Path(p).is_file() or sha256(Path(p)) != h)
        return self.lost


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def completed_data(run_root: Path) -> dict[str, str]:
    """Every file of every completed iteration folder (``iter_k`` with its COMPLETE marker) of a run."""
    out = {}
    for d in sorted(run_root.glob("iter_*")):
        if d.is_dir() and (d / "COMPLETE").is_file():
            out.update({str(f): sha256(f) for f in sorted(d.rglob("*")) if f.is_file()})
    return out


def pytest_collection_modifyitems(items):
    """Each test's declared faults enter the ledger as collected: one that never runs still counts, as not tried."""
    for item in items:
        item.faults = {name: Fault(name, item.nodeid, kind) for name, kind in planned(item)}
        LEDGER.extend(item.faults.values())


def pytest_deselected(items):
    for item in items:
        for f in getattr(item, "faults", {}).values():
            f.not_tried = "deselected (-m / -k)"


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """The final metrics and weights of the uninterrupted reference run (tests/faults/uninterrupted.py)."""
    from uninterrupted import train_reference

    return train_reference(tmp_path_factory.mktemp("reference"))


@pytest.fixture
def fault(request):
    """``fault(name)``: the declared fault ``name`` of this test (``@declares``), to guard files with."""
    declared = getattr(request.node, "faults", {})

    def take(name: str) -> Fault:
        if name not in declared:
            pytest.fail(f"fault {name!r} is not declared: add it to the test's @declares (tests/faults/ledger.py); "
                        f"declared: {sorted(declared)}")
        return declared[name]

    return take


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    out = yield
    rep = out.get_result()
    for f in getattr(item, "faults", {}).values():
        if rep.skipped:
            reason = rep.longrepr[-1] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            f.not_tried, f.survived = f"skipped: {reason}", False
        elif rep.when == "call":
            f.not_tried = None
            f.survived = rep.passed and (not f.guarded or (f.checked and not f.lost))
        elif rep.failed:  # set-up or tear-down failed: tried (a failure is not a skip), not survived
            f.not_tried, f.survived = None, False


def summary() -> dict:
    tried = [f for f in LEDGER if f.not_tried is None]
    guarded = set().union(*(f.guarded for f in LEDGER)) if LEDGER else set()
    counts = {kind: sum(f.kind == kind for f in tried) for kind in KINDS}
    return {"faults_tried": counts["real"] + counts["simulated"], **counts,
            "not_tried": sum(f.not_tried is not None for f in LEDGER),
            "survived": sum(f.survived for f in tried if f.kind != "input"),
            "inputs_refused": sum(f.survived for f in tried if f.kind == "input"),
            "data_lost": len(set().union(*(f.lost for f in LEDGER)) if LEDGER else set()),
            "guarded_files": len(guarded),  # distinct files: one guarded by several faults counts once
            "faults": [{"name": f.name, "test": f.test, "kind": f.kind, "survived": f.survived,
                        "not_tried": f.not_tried, "guarded_files": len(f.guarded), "lost": f.lost}
                       for f in LEDGER]}


def pytest_terminal_summary(terminalreporter):
    if not any(f.not_tried is None for f in LEDGER) and not os.environ.get("RAGEN_FAULTS_JSON"):
        return  # a session that ran no fault case (the unit tier, say) has nothing to count
    s = summary()
    terminalreporter.write_sep("-", "fault injection")
    for f in s["faults"]:
        state = "not tried" if f["not_tried"] else "survived" if f["survived"] else "FAILED"
        why = f"  [{f['not_tried']}]" if f["not_tried"] else ""
        terminalreporter.write_line(f"{state:9s}  {f['kind']:9s}  {f['name']}  (guarded {f['guarded_files']} files, "
                                    f"lost {len(f['lost'])}){why}")
    terminalreporter.write_line(f"faults tried {s['faults_tried']} ({s['real']} real, {s['simulated']} simulated), "
                                f"survived {s['survived']}; bad inputs {s['input']} (refused {s['inputs_refused']}); "
                                f"not tried {s['not_tried']}; data lost {s['data_lost']} of {s['guarded_files']} "
                                f"distinct guarded files")


def pytest_sessionfinish(session):
    out = os.environ.get("RAGEN_FAULTS_JSON")
    if out and LEDGER:
        Path(out).write_text(json.dumps(summary(), indent=1) + "\n")
