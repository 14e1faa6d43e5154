"""The warm-start's progress reaches the terminal of `ragen up` / `make run` while the worker trains it: the SFT
stage keeps its latest step in a file beside its output, and the progress watcher prints a line per new step."""

import json
import time

import pytest

from cli.common import iteration_progress
from ragen.sft.pipeline import progress_file, progress_line

pytestmark = pytest.mark.unit


def test_a_progress_line_says_step_loss_and_time_left():
    assert progress_line({"step": 12, "total": 48, "loss": 0.1712, "elapsed_s": 297.0}) == \
        "warm-start (SFT) step 12/48: loss 0.171, 297 s, about 15 min left"
    assert progress_line({"step": 46, "total": 48, "loss": 0.2, "elapsed_s": 920.0}) == \
        "warm-start (SFT) step 46/48: loss 0.200, 920 s, about 40 s left"
    assert progress_line({"step": 48, "total": 48, "loss": 0.127, "elapsed_s": 960.0}) == \
        "warm-start (SFT) step 48/48: loss 0.127, 960 s"


def test_the_watcher_prints_each_new_warm_start_step_once(tmp_path, capsys):
    out = tmp_path / "models" / "sft-warmstart"
    out.parent.mkdir()
    at = progress_file(out)
    assert at == tmp_path / "models" / "sft-warmstart.progress.json"
    with iteration_progress(tmp_path / "runs" / "r", 6, every_s=0.02, warm_start=out):
        time.sleep(0.1)  # nothing yet: no line
        at.write_text(json.dumps({"step": 2, "total": 48, "loss": 0.855, "elapsed_s": 73.0}))
        time.sleep(0.1)  # seen several times, printed once
        at.write_text(json.dumps({"step": 4, "total": 48, "loss": 0.862, "elapsed_s": 106.0}))
        time.sleep(0.1)
        at.unlink()  # the stage finished
        time.sleep(0.05)
    err = capsys.readouterr().err
    assert err.count("warm-start (SFT) step 2/48: loss 0.855, 73 s") == 1
    assert err.count("warm-start (SFT) step 4/48: loss 0.862, 106 s") == 1
