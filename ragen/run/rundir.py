"""A run directory is the unit of recovery (DESIGN.md 2): the resolved config, one folder per iteration with its
data, and a completion marker written last. Resuming continues after the last iteration whose marker exists.

    runs/<run>/config.yaml                 the resolved config the run was started with
    runs/<run>/iter_00007/instances.parquet, rollouts.parquet, metrics.json, eval.json (when evaluated)
    runs/<run>/iter_00007/state/           the trainer checkpoint after iteration 7 (resume point)
    runs/<run>/iter_00007/COMPLETE         written after everything above

Only the newest state is needed to resume; older ones are pruned by ``prune_states`` except every
``checkpoint_every``-th iteration, the final one and the best by eval score (the documented retention rule)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ragen.config import Config, config_to_dict, flatten

MARKER = "COMPLETE"
STATE = "state"
_ITER = re.compile(r"^iter_(\d{5})$")
# keys that may differ between the first start of a run and its resume without changing its data
RESUME_FREE = ("trainer.total_training_steps", "rollout.progress")


class ResumeError(RuntimeError):
    pass


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def at(cls, run_dir: str | Path, name: str) -> RunDir:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"run name {name!r} must be a plain folder name (no '/', not starting with '.')")
        return cls(Path(run_dir) / name)

    def iteration(self, k: int) -> Path:
        return self.root / f"iter_{k:05d}"

    def state(self, k: int) -> Path:
        return self.iteration(k) / STATE

    def completed(self) -> list[int]:
        """Iterations whose marker exists, in order."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = _ITER.match(p.name)
            if m and (p / MARKER).is_file():
                out.append(int(m.group(1)))
        return sorted(out)

    def next_iteration(self) -> int:
        """Where a (re)started run begins: 0, or after the last completed iteration. Completed iterations must be
        0..k without holes, else the directory was edited by hand and resuming would mix runs."""
        done = self.completed()
        if done != list(range(len(done))):
            missing = sorted(set(range(done[-1] + 1)) - set(done))
            raise ResumeError(f"run {self.root}: iterations {missing} are not complete but later ones are; "
                              f"restore them (dvc checkout) or start a new run")
        return len(done)

    def resume_state(self) -> Path | None:
        """The checkpoint to resume from: the state of the last completed iteration (None for a fresh run)."""
        k = self.next_iteration() - 1
        if k < 0:
            return None
        st = self.state(k)
        if not st.is_dir():
            raise ResumeError(f"run {self.root}: iteration {k} is complete but its checkpoint {st} is missing; "
                              f"restore it (dvc checkout {st}) or start a new run")
        return st

    def mark_complete(self, k: int, record: dict[str, Any]) -> None:
        (self.iteration(k) / MARKER).write_text(json.dumps(record, sort_keys=True) + "\n")

    # -- config ---------------------------------------------------------------------------------------------
    def bind_config(self, cfg: Config) -> None:
        """Write the config on the first start; on a restart insist it is the same run (except RESUME_FREE keys),
        naming every differing key."""
        path = self.root / "config.yaml"
        new = config_to_dict(cfg)
        if path.is_file():
            old = yaml.safe_load(path.read_text()) or {}
            a, b = flatten(old), flatten(new)
            diff = sorted(k for k in set(a) | set(b) if k not in RESUME_FREE and a.get(k) != b.get(k))
            if diff:
                shown = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in diff[:8])
                raise ResumeError(f"run {self.root} was started with a different config ({shown}); use another run "
                                  f"name or the original settings")
        self.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, yaml.safe_dump(new, sort_keys=False))


def write_text_atomic(path: Path, text: str) -> None:
    """A reader sees the old file or the new one, never half of one (as tables.write_table does for parquet)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True, allow_nan=True) + "\n")


def retained_states(done: list[int], checkpoint_every: int, best: int | None) -> set[int]:
    """The retention rule: keep the latest, the best, and every checkpoint_every-th (counting iterations from 1)."""
    if not done:
        return set()
    keep = {done[-1]} | {k for k in done if (k + 1) % checkpoint_every == 0}
    if best is not None:
        keep.add(best)
    return keep


def prune_states(run: RunDir, checkpoint_every: int, best: int | None) -> list[int]:
    """Delete the states the retention rule drops; returns the pruned iterations."""
    done = run.completed()
    keep = retained_states(done, checkpoint_every, best)
    pruned = []
    for k in done:
        if k not in keep and run.state(k).is_dir():
            shutil.rmtree(run.state(k))
            pruned.append(k)
    return pruned
