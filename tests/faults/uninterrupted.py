"""The uninterrupted run that the kill, SIGTERM and storage faults must each end equal to: the tiny model, HF
engine, cpu-small, 2 iterations, no evaluation before training. Trained once per session (tests/faults/conftest.py
``reference_run``); the tracking a test adds (Prefect, MLflow) does not change a metric or a weight."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file
from test_loop import TINY

STEPS = 2
ROOT = Path(__file__).resolve().parents[2]
# what every fault run and the reference share; a test adds its run folder (and, say, tracking) after these
SETTINGS = [*TINY, "trainer.val_before_train=false"]


def train_command(run_dir: Path, name: str, *more: str, prefect: bool = False, iterations: int = STEPS
                  ) -> list[str]:
    """``ragen train`` of the shared settings into ``run_dir/name``, with ``more`` overrides after them."""
    sets = [a for o in [*SETTINGS, f"trainer.run_dir={run_dir}", *more] for a in ("--set", o)]
    return [str(Path(sys.executable).with_name("ragen")), "train", *([] if prefect else ["--no-prefect"]), "--run",
            name, "--preset", "cpu-small", "--iterations", str(iterations), *sets]


# the engine's log-probs against the trainer's: float rounding (about 1e-7), equal only to that rounding between an
# engine that took its weights by the sync and one that loaded them from a checkpoint (seen on an AVX2 CPU)
ROUNDING = ("rollout/logprob_mismatch",)


def metric_gaps(run: dict, ref: dict, *, rounding: float = 1e-5) -> dict:
    """The metrics that differ, as key -> (run, reference): exact, except NaN equals NaN (an explained variance
    over equal returns) and the ``ROUNDING`` diagnostics agree within ``rounding``."""
    def same(k: str, a: object, b: object) -> bool:
        if isinstance(a, float) and isinstance(b, float):
            if math.isnan(a) or math.isnan(b):
                return math.isnan(a) and math.isnan(b)
            if k.startswith(ROUNDING):
                return abs(a - b) <= rounding
        return a == b

    return {k: (run.get(k), ref.get(k)) for k in run.keys() | ref.keys()
            if k not in run or k not in ref or not same(k, run[k], ref[k])}


def final_state(run: Path) -> tuple[dict, dict]:
    """The last iteration's metrics (less timings, rates and DVC's bookkeeping) and the actor's weights."""
    m = json.loads((run / f"iter_{STEPS - 1:05d}" / "metrics.json").read_text())
    same = {k: v for k, v in m.items() if not k.startswith(("timing_s/", "dvc/")) and "per_s" not in k}
    return same, load_file(str(run / "checkpoints" / f"iter_{STEPS - 1:05d}" / "actor" / "model.safetensors"))


def assert_same_final(run: Path, reference: tuple[dict, dict]) -> None:
    """``run`` ended with exactly the reference's metrics and weights."""
    (m_run, w_run), (m_ref, w_ref) = final_state(run), reference
    assert not metric_gaps(m_run, m_ref), metric_gaps(m_run, m_ref)
    assert w_run.keys() == w_ref.keys() and all((w_run[k] == w_ref[k]).all() for k in w_ref)


def train_reference(root: Path) -> tuple[dict, dict]:
    r = subprocess.run(train_command(root, "ref"), cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return final_state(root / "ref")
