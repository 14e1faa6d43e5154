"""Kill -9 in the middle of an update, rerun the same run: it continues from the last completed iteration and
ends with exactly the metrics and weights of an uninterrupted run with the same seed (tiny model, HF engine)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from test_loop import TINY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[1]
STEPS = 3


def train_cmd(run_dir, name):
    sets = [a for o in [*TINY, f"trainer.run_dir={run_dir}", "trainer.val_before_train=false"] for a in ("--set", o)]
    return [str(Path(sys.executable).with_name("ragen")), "train", "--no-prefect", "--run", name, "--preset",
            "cpu-small", "--iterations", str(STEPS), *sets]


def final(run_dir, name):
    d = Path(run_dir) / name
    m = json.loads((d / f"iter_{STEPS - 1:05d}" / "metrics.json").read_text())
    same = {k: v for k, v in m.items() if not k.startswith("timing_s/") and "tokens_per_s" not in k
            and "per_s" not in k}
    w = load_file(str(d / "checkpoints" / f"iter_{STEPS - 1:05d}" / "actor" / "model.safetensors"))
    return same, w


def test_sigkill_during_update_then_rerun_equals_uninterrupted(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    ref = subprocess.run(train_cmd(tmp_path, "ref"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stderr[-3000:]

    run = tmp_path / "killed"
    p = subprocess.Popen(train_cmd(tmp_path, "killed"), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    # filter.json is the last thing written before the update of iteration 1 starts
    t0 = time.monotonic()
    while not (run / "iter_00001" / "filter.json").is_file():
        assert p.poll() is None, "the run ended before iteration 1's update"
        assert time.monotonic() - t0 < 600
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL
    assert (run / "iter_00000" / "COMPLETE").is_file() and not (run / "iter_00001" / "COMPLETE").is_file()

    again = subprocess.run(train_cmd(tmp_path, "killed"), cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "completed iterations 1..2" in again.stdout
    (m_ref, w_ref), (m_run, w_run) = final(tmp_path, "ref"), final(tmp_path, "killed")
    assert m_run == m_ref
    assert w_run.keys() == w_ref.keys() and all((w_run[k] == w_ref[k]).all() for k in w_ref)
