"""Progress lines of a run that another process trains (what `ragen up` prints while the deployment trains)."""

from __future__ import annotations

import json
import os

import pytest

from ragen.run.progress import RunWatcher, iteration_line, time_left
from ragen.run.rundir import MARKER, RunDir

pytestmark = pytest.mark.unit


def complete(run: RunDir, k: int, metrics: dict[str, float]) -> None:
    d = run.iteration(k)
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.json").write_text(json.dumps(metrics))
    (d / MARKER).write_text("")


def test_iteration_line_averages_tags_and_leaves_out_the_panel_mean():
    m = {"train/A/success": 0.25, "train/B/success": 0.75, "val/A/success": 0.5, "val/all/success": 0.9,
         "train/A/non-zero/success": 1.0, "train/A/format_error_rate": 0.02, "train/B/format_error_rate": 0.0,
         "timing_s/iteration": 52.4, "timing_s/step": 31.2}
    assert iteration_line(2, m, 9) == ("iteration 3/10: train success 0.500, panel success 0.500, format errors 1.0%, "
                                       "52 s (update 31 s)")
    assert iteration_line(0, {}, 0) == "iteration 1/1: 0 s (update 0 s)"


def test_the_watcher_reports_each_new_iteration_once(tmp_path):
    run = RunDir(tmp_path / "r")
    complete(run, 0, {"train/A/success": 0.1})
    w = RunWatcher(run, total=3)
    assert w.new_lines() == []  # iteration 0 was done before the watcher looked
    complete(run, 1, {"train/A/success": 0.2, "timing_s/iteration": 60.0})
    (run.iteration(2)).mkdir()  # started, not complete
    assert w.new_lines() == ["iteration 2/3: train success 0.200, 60 s (update 0 s), about 60 s left"]
    assert w.new_lines() == []
    # the guard rolled iteration 1 back and it completed again: reported again
    marker = run.iteration(1) / MARKER
    st = marker.stat()
    os.utime(marker, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert w.new_lines() == ["iteration 2/3: train success 0.200, 60 s (update 0 s), about 60 s left"]


def test_time_left():
    assert time_left([], 0, 5) == "" and time_left([30.0], 5, 5) == ""
    assert time_left([40.0, 60.0], 2, 5) == "about 150 s left" and time_left([100.0], 1, 4) == "about 5 min left"


def test_the_watcher_of_a_run_not_started_yet(tmp_path):
    w = RunWatcher(RunDir(tmp_path / "new"), total=2)
    assert w.new_lines() == []
    complete(w.run, 0, {"val/A/success": 1.0})
    assert w.new_lines() == ["iteration 1/2: panel success 1.000, 0 s (update 0 s)"]


def test_iteration_progress_prints_what_completes_while_the_body_runs(tmp_path, capsys):
    from cli.common import iteration_progress

    run = RunDir(tmp_path / "r")
    complete(run, 0, {"train/A/success": 0.1})  # before: not repeated
    with iteration_progress(run.root, total=3, every_s=0.01):
        complete(run, 1, {"train/A/success": 0.5, "timing_s/iteration": 10.0})
    err = capsys.readouterr().err
    assert "iteration 2/3: train success 0.500, 10 s (update 0 s), about 10 s left" in err
    assert "iteration 1/3" not in err and err.count("iteration 2/3") == 1
