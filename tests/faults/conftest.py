"""The fault-injection and bad-input suite (issue 8). Every case declares the faults it injects with the ``fault``
fixture; a fault *survives* when its test passes (the pipeline kept working or stopped with a clear error), and
its *data lost* is what changed or vanished among the files it guarded: the completed iterations of a run,
snapshotted before the fault and compared after recovery. The session prints the counts and, with
``RAGEN_FAULTS_JSON`` set (``ragen bench faults --json``), writes them there."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

LEDGER: list[Fault] = []


@dataclass
class Fault:
    name: str
    test: str
    kind: str = "real"  # real: the fault happens (a signal, a bad file, a dead server); simulated: code pretends it
    survived: bool = False
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


@pytest.fixture
def fault(request):
    def declare(name: str, kind: str = "real") -> Fault:
        assert kind in ("real", "simulated"), kind
        f = Fault(name, request.node.nodeid, kind)
        LEDGER.append(f)
        request.node.faults = [*getattr(request.node, "faults", []), f]
        return f

    return declare


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    out = yield
    rep = out.get_result()
    for f in getattr(item, "faults", []):
        if rep.when == "call":
            f.survived = rep.passed and (not f.guarded or (f.checked and not f.lost))
        elif rep.failed:  # set-up or tear-down failed: the case did not show survival
            f.survived = False


def summary() -> dict:
    return {"faults_tried": len(LEDGER), "real": sum(f.kind == "real" for f in LEDGER),
            "simulated": sum(f.kind == "simulated" for f in LEDGER), "survived": sum(f.survived for f in LEDGER),
            "data_lost": sum(len(f.lost) for f in LEDGER),
            "guarded_files": sum(len(f.guarded) for f in LEDGER),
            "faults": [{"name": f.name, "test": f.test, "kind": f.kind, "survived": f.survived,
                        "guarded_files": len(f.guarded),
                        "lost": f.lost} for f in LEDGER]}


def pytest_terminal_summary(terminalreporter):
    if not LEDGER:
        return
    s = summary()
    terminalreporter.write_sep("-", "fault injection")
    for f in s["faults"]:
        terminalreporter.write_line(f"{'survived' if f['survived'] else 'FAILED  '}  {f['kind']:9s}  {f['name']}  "
                                    f"(guarded {f['guarded_files']} files, lost {len(f['lost'])})")
    terminalreporter.write_line(f"faults tried {s['faults_tried']} ({s['real']} real, {s['simulated']} simulated), "
                                f"survived {s['survived']}, data lost "
                                f"{s['data_lost']} of {s['guarded_files']} guarded files")


def pytest_sessionfinish(session):
    out = os.environ.get("RAGEN_FAULTS_JSON")
    if out and LEDGER:
        Path(out).write_text(json.dumps(summary(), indent=1) + "\n")
