
"""Runs side by side (ragen/report/compare.py) on hand-made run directories: one the guard rolled back, one not."""

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from ragen.report.compare import markdown, summarize
from ragen.run.guard import GuardState, Rollback
from ragen.run.rundir import RunDir

pytestmark = pytest.mark.unit


def make_run(root, scores, archived=None, rollback=None):
    run = RunDir(root)
    run.root.mkdir(parents=True)
    (run.root / "config.yaml").write_text("{}\n")
    for k, s in enumerate(scores):
        run.iteration(k).mkdir()
        (run.iteration(k) / "metrics.json").write_text(json.dumps({"val/score": s, "actor/entropy_loss": 1.0 + k,
                                                                   "echo/warning": float(s < 0)}))
        run.mark_complete(k, {"iteration": k})
    if rollback is not None:
        for k, s in archived.items():
            d = run.root / "guard" / "rollback-1" / f"iter_{k:05d}"
            d.mkdir(parents=True)
            (d / "metrics.json").write_text(json.dumps({"val/score": s, "actor/entropy_loss": 9.0}))
        GuardState([rollback]).write(run)
    return run.root


def test_summary_table_and_figure(tmp_path):
    off = make_run(tmp_path / "off", [0.2, -0.5, -1.0, -1.0])
    on = make_run(tmp_path / "on", [0.2, 0.3, 0.4, 0.5], archived={1: -0.5, 2: -1.0},
                  rollback=Rollback(at=2, to=0, signals=["entropy_rise"], lr_factor=0.1, overrides=[],
                                    archived="guard/rollback-1"))
    a, b = summarize(off, last=2), summarize(on, last=2)
    assert a["iterations"] == 4 and a["rollbacks"] == [] and a["echo_warnings"] == 3
    assert a["val/score"] == {"first": 0.2, "last": -1.0, "max": 0.2, "min": -1.0, "mean_last_2": -1.0}
    assert b["rollbacks"] == [{"at": 2, "to": 0, "signals": ["entropy_rise"], "lr_factor": 0.1}]
    assert b["val/score"]["mean_last_2"] == 0.45 and b["rolled_back"]["val/score"] == {"max": -0.5, "min": -1.0}
    table = markdown([a, b], keys=("val/score",), last=2)
    assert "| on | 4 | at 2 -> after 0 (entropy_rise, lr x0.1) | 0.2 -> 0.45 |" in table
    r = CliRunner().invoke(app, ["runs", "compare", str(off), str(on), "--out", str(tmp_path / "cmp")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "cmp" / "summary.json").read_text())[1]["rollbacks"][0]["at"] == 2
    r = CliRunner().invoke(app, ["runs", "compare", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "not run directories" in r.output
