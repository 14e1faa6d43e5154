"""The fault ledger: the faults a test injects are declared up front (``@declares``), so the fault bench counts
each one whether or not it ran: a fault whose test was skipped or deselected shows as ``not tried`` with the reason
instead of vanishing. A fault *survives* when its test passes (the pipeline kept working or stopped with a clear
error); its *data lost* is what changed or vanished among the files it guarded, snapshotted before the fault and
compared before any repair step of the test.

Kinds: ``real`` (the failure really happens to a real component: a signal, a damaged file, a dead server),
``simulated`` (code pretends it: a patched writer, a scripted engine standing in for the model), ``input`` (bad
arguments or settings given to a command, counted apart from faults).

This module is also the pytest plugin that keeps the ledger (``register``, from tests/conftest.py and
tests/faults/conftest.py): under pytest-xdist each worker keeps the faults of the tests it ran and the controller
merges them, so ``make test`` (two workers) counts what a one-process session counts. The session prints the
counts and, with ``RAGEN_FAULTS_JSON`` set (``ragen bench faults --json``), writes them there."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

KINDS = ("real", "simulated", "input")
PLUGIN = "ragen-fault-ledger"
LEDGER: list[Fault] = []  # this process's faults, as collected
NOT_RUN = "its test did not run"  # a fault's state until its test runs, is skipped or is deselected


def declares(*faults: tuple[str, str] | str) -> pytest.MarkDecorator:
    """``@declares("name", ("other", "simulated"))``: the faults a test injects (kind ``real`` unless given). A
    name may hold ``{param}`` fields of a parametrized test (a list parameter is joined with spaces)."""
    plan = []
    for f in faults:
        name, kind = (f, "real") if isinstance(f, str) else f
        if kind not in KINDS:
            raise ValueError(f"fault kind {kind!r} of {name!r}: one of {KINDS}")
        plan.append((name, kind))
    return pytest.mark.fault_plan(plan)


def planned(item: Any) -> list[tuple[str, str]]:
    """The faults one collected test declares, with its parameters filled in."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    shown = {k: " ".join(map(str, v)) if isinstance(v, list | tuple) else v for k, v in params.items()}
    return [(name.format(**shown), kind) for m in item.iter_markers("fault_plan") for name, kind in m.args[0]]



@dataclass
class Fault:
    name: str
    test: str
    kind: str = "real"  # one of KINDS
    survived: bool = False
    not_tried: str | None = NOT_RUN  # None once its test ran; else why not (skipped, deselected)
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


def merge(records: list[dict]) -> list[dict]:
    """One record per declared fault from several processes' ledgers (each xdist worker collects every test but
    runs only its share): the record of the process that ran its test (tried, or skipped with the reason), else
    the first (deselected, or not run anywhere)."""
    def known(r: dict) -> int:
        return 2 if r["not_tried"] is None else 0 if r["not_tried"] == NOT_RUN else 1

    out: dict[tuple[str, str], dict] = {}
    for r in records:
        key = (r["test"], r["name"])
        if key not in out or known(r) > known(out[key]):
            out[key] = r
    return list(out.values())


def summary(records: list[dict]) -> dict:
    """The counts of a session's fault records (``Fault`` as dicts)."""
    tried = [f for f in records if f["not_tried"] is None]
    counts = {kind: sum(f["kind"] == kind for f in tried) for kind in KINDS}
    return {"faults_tried": counts["real"] + counts["simulated"], **counts,
            "not_tried": sum(f["not_tried"] is not None for f in records),
            "survived": sum(f["survived"] for f in tried if f["kind"] != "input"),
            "inputs_refused": sum(f["survived"] for f in tried if f["kind"] == "input"),
            "data_lost": len({p for f in records for p in f["lost"]}),
            # distinct files: one guarded by several faults counts once
            "guarded_files": len({p for f in records for p in f["guarded"]}),
            "faults": [{"name": f["name"], "test": f["test"], "kind": f["kind"], "survived": f["survived"],
                        "not_tried": f["not_tried"], "guarded_files": len(f["guarded"]), "lost": f["lost"]}
                       for f in records]}


class LedgerPlugin:
    """The pytest hooks that keep the ledger, for a one-process session, an xdist worker or its controller."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.from_workers: list[dict] | None = None  # set on an xdist controller once a worker reports

    def pytest_collection_modifyitems(self, items):
        """Each test's declared faults enter the ledger as collected: one that never runs still counts."""
        for item in items:
            item.faults = {name: Fault(name, item.nodeid, kind) for name, kind in planned(item)}
            LEDGER.extend(item.faults.values())

    def pytest_deselected(self, items):
        for item in items:
            for f in getattr(item, "faults", {}).values():
                f.not_tried = "deselected (-m / -k)"

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
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

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """xdist controller: a worker's ledger, sent as it ends (``pytest_sessionfinish`` below)."""
        self.from_workers = (self.from_workers or []) + json.loads(node.workeroutput.get("fault_ledger", "[]"))

    def records(self) -> list[dict]:
        if self.from_workers is not None:
            return merge(self.from_workers)
        return [{k: v for k, v in asdict(f).items() if k != "checked"} for f in LEDGER]

    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workeroutput"):  # an xdist worker: the controller counts and reports
            self.config.workeroutput["fault_ledger"] = json.dumps(self.records())
            return
        out = os.environ.get("RAGEN_FAULTS_JSON")
        records = self.records()
        if out and records:
            Path(out).write_text(json.dumps(summary(records), indent=1) + "\n")

    def pytest_terminal_summary(self, terminalreporter):
        records = self.records()
        if not any(f["not_tried"] is None for f in records) and not os.environ.get("RAGEN_FAULTS_JSON"):
            return  # a session that ran no fault case (the unit tier, say) has nothing to count
        s = summary(records)
        terminalreporter.write_sep("-", "fault injection")
        for f in s["faults"]:
            state = "not tried" if f["not_tried"] else "survived" if f["survived"] else "FAILED"
            why = f"  [{f['not_tried']}]" if f["not_tried"] else ""
            terminalreporter.write_line(f"{state:9s}  {f['kind']:9s}  {f['name']}  (guarded {f['guarded_files']} "
                                        f"files, lost {len(f['lost'])}){why}")
        terminalreporter.write_line(
            f"faults tried {s['faults_tried']} ({s['real']} real, {s['simulated']} simulated), survived "
            f"{s['survived']}; bad inputs {s['input']} (refused {s['inputs_refused']}); not tried {s['not_tried']}; "
            f"data lost {s['data_lost']} of {s['guarded_files']} distinct guarded files")


def register(config: pytest.Config) -> None:
    """Keep the ledger in this session (once, whichever conftest asks first)."""
    if not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.register(LedgerPlugin(config), PLUGIN)

