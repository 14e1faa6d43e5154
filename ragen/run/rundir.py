"""A run directory is the unit of recovery (DESIGN.md 2): the resolved config, one folder per iteration with its
data, and a completion marker written last. Resuming continues after the last iteration whose marker exists.

    runs/<run>/config.yaml                 the resolved config the run was started with
    runs/<run>/iter_00007/instances.parquet, rollouts.parquet, metrics.json, eval.json (when evaluated)
    runs/<run>/iter_00007/COMPLETE         written after everything above
    runs/<run>/checkpoints/iter_00007/     the trainer checkpoint after iteration 7 (resume point)
    runs/<run>/iter_00007.dvc, checkpoints/iter_00009.dvc   DVC pointers of what was versioned

Data folders and checkpoints are separate so that DVC versions every iteration's data but only some checkpoints
(each holds the actor, critic and optimizer state). Only the newest checkpoint is needed to resume; older ones
are pruned by ``prune_states`` under the retention rule of ``retained_states``: keep the latest, the best by
eval score, every ``checkpoint_every``-th, and every checkpoint DVC versioned (``states_to_version``: the
checkpoint_every-th, the final one and each new best)."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ragen.config import Config, config_to_dict, flatten, in_schema
from ragen.io import write_text_atomic

MARKER = "COMPLETE"
CHECKPOINTS = "checkpoints"
STATE_MARKER = "checkpoint-complete"  # written last by Trainer.save
DVC_SUFFIX = ".dvc"
_ITER = re.compile(r"^iter_(\d{5})$")
# keys that may differ between the first start of a run and its resume without changing its data
# (prefixes: where runs are logged and versioned is not part of what they compute)
# Settings added to the schema after runs were made with the behaviour their default keeps: at that default they
# are not part of a run's identity, so those runs keep their names (and restarts are not refused) across the addition.
# (the sync gate's calibration only decides whether a run stops, never what a run that goes on computes;
# model.emulated_bf16=fp32 changes nothing on the bf16-native CPU the committed grid ran on)
LATER_KEYS = {"actor.compute_dtype": "fp32", "critic.compute_dtype": "fp32", "rollout.sync_floor_factor": 2.0,
              "model.emulated_bf16": "fp32", "algorithm.zero_variance_groups": "keep", "algorithm.kl_monitor": False,
              "algorithm.kl_monitor_size": 0,
              "critic.value_head_lr": None, "critic.value_scale": 1.0, "envs.train_seeds": None}
# Settings the schema has dropped, at the value every run made while they existed computed with (the adaptive KL
# controller was never wired): a run's name still hashes them, so runs made before keep their names.
DROPPED_KEYS = {"algorithm.kl_ctrl": "fixed", "algorithm.kl_target": 0.1, "algorithm.kl_horizon": 10000}
RESUME_FREE = ("trainer.total_training_steps", "rollout.progress", "tracking.", "diagnostics.")


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
        import os

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
        (self.iteration(k) / MARKER).write_text(json.dumps(record, sort_keys=True) + "\n")

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


def identity(flat: dict[str, Any]) -> dict[str, Any]:
    """The settings that make a run's data, from a flattened config: the warm-start and SFT settings count only
    when the run starts from a warm-start (``model.warm_start`` off, or auto without thinking, leaves them out),
    the collapse guard's only when it is enabled, and ``LATER_KEYS`` only away from the value that computes what
    runs made before they existed computed (their default then), so such a run keeps its identity."""
    ws = flat.get("model.warm_start", "off")
    if ws in ("off", False) or (ws == "auto" and not flat.get("agent.enable_think", True)):
        flat = {k: v for k, v in flat.items() if not k.startswith("sft.") and k != "model.warm_start"}
    if not flat.get("guard.enabled", False):  # an idle collapse guard changes nothing a run makes
        flat = {k: v for k, v in flat.items() if not k.startswith("guard.")}
    return {k: v for k, v in flat.items() if not (k in LATER_KEYS and v == LATER_KEYS[k])}


# errors of a run directory's storage rather than of the program: the run stops with what to fix
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}


# how libraries that do their own I/O (safetensors' Rust writer, pyarrow) word the same errors
STORAGE_WORDS = tuple(os.strerror(n) for n in sorted(STORAGE_ERRNOS - {errno.EACCES, errno.EPERM}))


def storage_failure(run: RunDir, e: BaseException) -> str | None:
    """The message for a training run stopped by its storage (disk full, quota, read-only, I/O error), or None
    for any other error: what failed, and that the completed iterations are intact and a rerun resumes."""
    if isinstance(e, OSError):
        if e.errno not in STORAGE_ERRNOS:
            return None
    elif not any(w in str(e) for w in STORAGE_WORDS):  # e.g. SafetensorError "... No space left on device"
        return None
    else:
        e = OSError(next(n for n in STORAGE_ERRNOS if os.strerror(n) in str(e)), f"{type(e).__name__}: {e}")
    done = run.completed()
    kept = (f"iterations 0..{done[-1]} are complete and intact" if done else "no iteration had completed")
    where = f" ({e.filename})" if e.filename else ""
    return (f"run {run.root}: a write failed{where}: {e.strerror or e}; {kept}. Free space or fix the "
            f"permissions of {run.root}, then run the same command again: it resumes at iteration "
            f"{len(done)}")


def config_name(cfg: Config) -> str:
    """A run name from the settings that make a run's data (those a restart may not change): ``p-<hash>``."""
    import hashlib

    flat = {k: v for k, v in identity(flatten(config_to_dict(cfg))).items() if not k.startswith(RESUME_FREE)}
    flat = {**DROPPED_KEYS, **flat}
    return "p-" + hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:10]


def is_checkpoint_iteration(k: int, checkpoint_every: int, last: int) -> bool:
    """Every checkpoint_every-th iteration (counting from 1) and the last one."""
    return (k + 1) % checkpoint_every == 0 or k == last


def states_to_version(k: int, checkpoint_every: int, last: int, best: int | None) -> bool:
    """Whether iteration k's checkpoint goes to DVC when k completes: a checkpoint iteration, or the new best."""
    return is_checkpoint_iteration(k, checkpoint_every, last) or k == best


def retained_states(done: list[int], checkpoint_every: int, best: int | None) -> set[int]:
    """The retention rule: keep the latest, the best, and every checkpoint_every-th (counting iterations from 1)."""
    if not done:
        return set()
    keep = {k for k in done if is_checkpoint_iteration(k, checkpoint_every, last=done[-1])}
    if best is not None:
        keep.add(best)
    return keep


def prune_states(run: RunDir, checkpoint_every: int, best: int | None) -> list[int]:
    """Delete the states the retention rule drops (never a versioned one: its pointer would dangle and
    ``dvc status`` would report it deleted); returns the pruned iterations."""
    done = run.completed()
    keep = retained_states(done, checkpoint_every, best)
    pruned = []
    for k in done:
        if k not in keep and run.state(k).is_dir() and not run.is_versioned(run.state(k)):
            shutil.rmtree(run.state(k))
            pruned.append(k)
    return pruned
