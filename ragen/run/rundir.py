"""A run directory is the unit of recovery (docs/design.md): the resolved config, one folder per iteration with its
data, and a completion marker written last. Resuming continues after the last iteration whose marker exists.

    runs/<run>/config.yaml                 the resolved config the run was started with
    runs/<run>/iter_00007/instances.parquet, rollouts.parquet, metrics.json, eval.json (when evaluated)
    runs/<run>/iter_00007/COMPLETE         written after everything above
    runs/<run>/checkpoints/iter_00007/     the trainer checkpoint after iteration 7 (resume point)
    runs/<run>/iter_00007.dvc, checkpoints/iter_00009.dvc   DVC pointers of what was versioned

Data folders and checkpoints are separate so that DVC versions every iteration's data but only some checkpoints
(each holds the actor, critic and optimizer state); which are kept is retention.py. What makes two starts the same
run is identity.py; what a failed write to the run directory tells the user is storage.py."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ragen.config import Config, config_to_dict, flatten, in_schema
from ragen.io import fsync_path, sync_tree, write_text_atomic
from ragen.run.identity import RESUME_FREE, identity

MARKER = "COMPLETE"
CHECKPOINTS = "checkpoints"
STATE_MARKER = "checkpoint-complete"  # written last by Trainer.save
# the parts of a checkpoint only a resume reads (the critic, its LoRA adapters, DeepSpeed's optimizer and engine
# state); actor/ (or adapters/actor) is what evaluation and export load
RESUME_STATE = ("critic", "adapters/critic", "deepspeed")
DVC_SUFFIX = ".dvc"
_ITER = re.compile(r"^iter_(\d{5})$")


def in_resume_state(rel: Path) -> bool:
    """Whether a path relative to a checkpoint lies in its resume state."""
    return any(rel.parts[:len(Path(r).parts)] == Path(r).parts for r in RESUME_STATE)


class ResumeError(RuntimeError):
    pass


class RunBusyError(ResumeError):
    """Another process is training this run directory right now."""


LOCK = ".lock"
_HELD: dict[Path, tuple[Any, int]] = {}  # run directories this process holds: (open lock file, depth)


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
        return self.root / CHECKPOINTS / f"iter_{k:05d}"

    @staticmethod
    def pointer(path: Path) -> Path:
        """The .dvc file DVC writes beside a tracked folder or file."""
        return path.with_name(path.name + DVC_SUFFIX)

    def is_versioned(self, path: Path) -> bool:
        return self.pointer(path).is_file()

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

    def metrics(self, k: int) -> dict[str, float]:
        """Iteration k's metrics.json ({} when it has none); a damaged one is named with how to restore it."""
        p = self.iteration(k) / "metrics.json"
        if not p.is_file():
            return {}
        try:
            return json.loads(p.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            restore = (f"restore it with `dvc checkout {self.pointer(self.iteration(k))}`"
                       if self.is_versioned(self.iteration(k)) else "it was not DVC-versioned: start a new run")
            raise ResumeError(f"run {self.root}: {p} is damaged ({type(e).__name__}: {e}); {restore}") from None

    @contextmanager
    def locked(self) -> Iterator[RunDir]:
        """Hold the run directory for this process (an exclusive lock on ``<run>/.lock``, reentrant within the
        process, released by the OS if the process dies): a second process starting the same run is refused
        instead of both writing the same iterations."""
        import fcntl

        self.root.mkdir(parents=True, exist_ok=True)
        key = self.root.resolve()
        if key in _HELD:
            f, depth = _HELD[key]
            _HELD[key] = (f, depth + 1)
        else:
            f = (self.root / LOCK).open("a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                f.close()
                raise RunBusyError(f"run {self.root} is being trained by {holder}; wait for it to finish, or "
                                   f"give this one another --run name") from None
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()}\n")
            f.flush()
            _HELD[key] = (f, 1)
        try:
            yield self
        finally:
            f, depth = _HELD[key]
            if depth > 1:
                _HELD[key] = (f, depth - 1)
            else:
                del _HELD[key]
                f.close()  # closing the descriptor releases the lock

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
        if not (st / STATE_MARKER).is_file():
            what = "is incomplete (no " + STATE_MARKER + ")" if st.is_dir() else "is missing"
            raise ResumeError(self.unusable_state(k, f"its checkpoint {st} {what}"))
        return st

    def last_good_state(self, before: int) -> int | None:
        """The newest iteration before ``before`` whose checkpoint is on disk and complete."""
        good = [j for j in self.completed() if j < before and (self.state(j) / STATE_MARKER).is_file()]
        return good[-1] if good else None

    def unusable_state(self, k: int, problem: str) -> str:
        """The message for a checkpoint a resume cannot use: what is wrong, how to restore it, where to fall back."""
        st = self.state(k)
        restore = (f"restore it with `dvc checkout {self.pointer(st)}` (or `dvc pull` it from the remote)"
                   if self.is_versioned(st) else "it was not DVC-versioned, so it cannot be restored")
        j = self.last_good_state(k)
        back = (f"the last good iteration is {j} ({self.state(j)}): to continue from it, delete the {MARKER} "
                f"files of iterations {j + 1}..{k}" if j is not None else
                "no earlier checkpoint is complete: start a new run")
        return f"run {self.root}: iteration {k} is complete but {problem}; {restore}, or {back}"

    def mark_complete(self, k: int, record: dict[str, Any]) -> None:
        """The commit point of iteration k: its files and the run's own (config, guard state) reach the disk before
        the marker does, so a power cut or a dead disk never leaves a marker over missing or empty files."""
        d = self.iteration(k)
        sync_tree(d)
        for p in self.root.iterdir():
            if p.is_file() and not p.is_symlink():
                fsync_path(p)
        write_text_atomic(d / MARKER, json.dumps(record, sort_keys=True) + "\n")
        fsync_path(self.root)  # the iteration's own name, and the run's in its parent (made at the first start)
        fsync_path(self.root.parent)

    # -- config ---------------------------------------------------------------------------------------------
    def bind_config(self, cfg: Config) -> None:
        """Write the config on the first start; on a restart insist it is the same run (except RESUME_FREE keys),
        naming every differing key."""
        path = self.root / "config.yaml"
        new = config_to_dict(cfg)
        if path.is_file():
            old = yaml.safe_load(path.read_text()) or {}
            # a key the run's config predates counts as its schema default (runs survive schema additions)
            # (a default of {} is not missing where the old config has keys below it, e.g. envs.custom.<Tag>.*)
            defaults = flatten(config_to_dict(type(cfg)()))
            was = flatten(old)
            below = {".".join(k.split(".")[:i]) for k in was for i in range(1, k.count(".") + 1)}
            # and a key the schema has since dropped does not count at all
            a = identity({**{k: v for k, v in defaults.items() if k not in was and k not in below},
                          **{k: v for k, v in was.items() if in_schema(k)}})
            b = identity(flatten(new))
            diff = sorted(k for k in set(a) | set(b) if not k.startswith(RESUME_FREE) and a.get(k) != b.get(k))
            if diff:
                shown = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in diff[:8])
                raise ResumeError(f"run {self.root} was started with a different config ({shown}); use another run "
                                  f"name or the original settings")
        self.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, yaml.safe_dump(new, sort_keys=False))
