"""DVC versioning of a run directory: after each completed iteration its data folder (and, under the retention
rule of ragen.run.rundir, its checkpoint) is ``dvc add``-ed and pushed to the repo's remote, so any iteration of
any run can be checked out later. ``dvc add`` runs in-process (no CLI start-up per call); the push runs in a child
process with a deadline (tasks/dvc_push.py), since a remote can stop answering. One DVC call at a time: DVC allows
one command per repo.

Safe to retry and to repeat: ``add`` of an unchanged path and ``push`` of objects the remote has are no-ops, and
each call also versions whatever an earlier, failed or killed call left unversioned."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from prefect import task
from prefect.cache_policies import NO_CACHE

from ragen.config import Config
from ragen.run.iteration import EVAL_INIT, best_iteration
from ragen.run.retention import states_to_version
from ragen.run.rundir import MARKER, RESUME_STATE, RunDir

T = TypeVar("T")


class VersioningError(RuntimeError):
    pass


class PushStalled(VersioningError):
    """The remote did not take a push in time; pushes pause for a while, the local versioning goes on."""


# after a push times out, pushes to that remote pause for this many times its deadline (then one is tried again):
# a hung remote then costs at most about 1/11 of the run's time, and a remote that comes back is used again
STALL_PAUSE_FACTOR = 10
_stalled: dict[tuple[str, str], tuple[float, str]] = {}  # (repo, remote) -> (pause ends, monotonic; the reason)


def push_with_deadline(root: Path, targets: list[str], remote: str | None, timeout_s: float) -> int:
    """Push ``targets`` unless that remote timed out lately (``PushStalled`` then, and on a new timeout)."""
    from tasks.dvc_push import PushTimeout, push

    key = (str(root), remote or "")
    pause = _stalled.get(key)
    if pause is not None and time.monotonic() < pause[0]:
        raise PushStalled(f"push skipped: {pause[1]}; pushes to it pause for another "
                          f"{pause[0] - time.monotonic():.0f} s. The data is versioned in the local DVC cache; a "
                          f"later push (or `dvc push` in {root}) sends it")
    try:
        pushed = push(root, targets, remote, timeout_s)
    except PushTimeout as e:
        _stalled[key] = (time.monotonic() + STALL_PAUSE_FACTOR * timeout_s, str(e))
        raise PushStalled(f"{e}: the remote is not answering. The data is versioned in the local DVC cache; the "
                          f"next push after {STALL_PAUSE_FACTOR * timeout_s:.0f} s (or `dvc push` in {root}) sends "
                          f"it") from None
    _stalled.pop(key, None)
    return pushed


def dvc_root(run: RunDir) -> Path:
    """The DVC repository holding the run directory, or a clear error saying how to make one."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    run.root.mkdir(parents=True, exist_ok=True)
    try:
        return Path(Repo.find_root(str(run.root.resolve())))
    except NotDvcRepoError:
        raise VersioningError(f"run directory {run.root} is not inside a DVC repository: run `dvc init` (and "
                              f"`dvc remote add -d NAME PATH`) in the project, or set tracking.dvc=false") from None


def init_repo(root: Path, remote: Path) -> None:
    """A git + DVC repo at ``root`` with ``remote`` as its default remote, set up as the project's own."""
    import subprocess
    import sys

    dvc = str(Path(sys.executable).with_name("dvc"))
    root.mkdir(parents=True)
    for cmd in (["git", "init", "-q"], [dvc, "init", "-q"], [dvc, "remote", "add", "-d", "local", str(remote)],
                [dvc, "config", "cache.type", "hardlink,symlink,copy"], [dvc, "config", "core.analytics", "false"]):
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)


def check_remote(cfg: Config, run: RunDir) -> str:
    """The remote pushes go to (tracking.dvc_remote or the repo's default), checked before any training."""
    from dvc.repo import Repo

    with Repo(str(dvc_root(run))) as repo:
        remotes = repo.config.get("remote", {})
        name = cfg.tracking.dvc_remote or repo.config.get("core", {}).get("remote")
    if not name or name not in remotes:
        have = ", ".join(sorted(remotes)) or "none"
        raise VersioningError(f"DVC remote {name!r} is not configured (remotes: {have}): set tracking.dvc_remote "
                              f"to one of them, or add one with `dvc remote add -d NAME PATH`")
    return name


def check_resume_data(run: RunDir) -> list[Path]:
    """Before a continuation builds on them: the last completed iteration's folder and checkpoint, where DVC
    versioned them, still hold the bytes their pointers recorded (bit rot, an edit through a hardlink into the
    cache). A difference stops the start with the repair; returns what could not be checked (no listing in the
    cache)."""
    from dvc.repo import Repo

    from tasks.dvc_verify import differs_from_pointer

    done = run.completed()
    if not done:
        return []
    with Repo(str(dvc_root(run))) as repo:
        cache = Path(repo.cache.local.path)
    unchecked = []
    for path in (run.iteration(done[-1]), run.state(done[-1])):
        bad = differs_from_pointer(path, cache)
        if bad is None:
            if run.is_versioned(path):
                unchecked.append(path)
            continue
        if bad:
            pointer = run.pointer(path)
            raise VersioningError(
                f"run {run.root}: {path} no longer matches its DVC pointer {pointer} ({len(bad)} file(s) differ: "
                f"{', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); it was damaged after it was versioned, and "
                f"the run will not continue from it. Restore it: `ragen runs verify` (repairs DVC's cache from the "
                f"remote), then `dvc checkout --force {pointer}`, and run the same command again")
    return unchecked


def pending(run: RunDir, k: int, last: int, checkpoint_every: int) -> list[Path]:
    """What is not yet versioned up to iteration k: run-level files, completed data folders, and the
    checkpoints the rule versions (checkpoint iterations, the last, the best) that are still on disk."""
    # config.yaml every time: a continued run rewrites it with its longer total_training_steps
    out = [p for p in (run.root / "config.yaml", run.root / EVAL_INIT)
           if p.is_file() and (p.name == "config.yaml" or not run.is_versioned(p))]
    best = best_iteration(run)
    for j in run.completed():
        if j > k:
            break
        if not run.is_versioned(run.iteration(j)):
            out.append(run.iteration(j))
        st = run.state(j)
        if states_to_version(j, checkpoint_every, last, best) and st.is_dir() and not run.is_versioned(st):
            out.append(st)
    return out


def leave_out_resume_state(run: RunDir, states: list[Path], last: int) -> list[str]:
    """Under ``tracking.dvc_resume_state=last``: the run's ``.dvcignore`` lists the resume state of every
    checkpoint in ``states`` but the last iteration's, so ``dvc add`` versions their actor only. DVC refuses an
    ignore file inside a folder it adds, so the patterns live at the run's root. Returns the patterns added."""
    path = run.root / ".dvcignore"
    have = path.read_text().splitlines() if path.is_file() else []
    new = [f"/{st.relative_to(run.root).as_posix()}/{part}/" for st in states if st != run.state(last)
           for part in RESUME_STATE]
    new = [p for p in new if p not in have]
    if new:
        head = [] if have else ["# resume state kept in the run directory, versioned with the last checkpoint only "
                                "(tracking.dvc_resume_state)"]
        path.write_text("\n".join([*have, *head, *new]) + "\n")
    return new


def forget(run: RunDir, k: int) -> list[Path]:
    """Drop the pointers of iteration k's data and checkpoint when k is about to be computed again (its COMPLETE
    marker was removed to roll back): they describe the old outputs, and ``pending`` would skip the new ones.
    The old objects stay in the cache and on the remote."""
    gone = []
    for path in (run.iteration(k), run.state(k)):
        p = run.pointer(path)
        if p.is_file() and not (run.iteration(k) / MARKER).is_file():
            p.unlink()
            gone.append(p)
    return gone


def pointers(run: RunDir) -> list[Path]:
    return sorted(run.root.rglob("*.dvc"))


LOCK_WAIT_S = 600.0  # how long versioning waits for another DVC command (another run's versioning, a dvc CLI)


def when_unlocked(root: Path, fn: Callable[[], T], wait_s: float = LOCK_WAIT_S) -> T:
    """``fn()`` (DVC calls on the repo at ``root``), retried while another process holds the repo's lock: DVC
    allows one command per repo, and two runs on one machine version into the same repo."""
    from dvc.lock import LockError

    deadline, delay = time.monotonic() + wait_s, 0.5
    while True:
        try:
            return fn()
        except LockError as e:
            if time.monotonic() > deadline:
                raise VersioningError(f"the DVC repository {root} stayed locked for {wait_s:.0f} s ({e}); "
                                      f"another DVC command holds it: versioning catches up after the next "
                                      f"iteration") from None
            time.sleep(delay)
            delay = min(2 * delay, 10.0)


def version(cfg: Config, run: RunDir, k: int, last: int) -> dict[str, float]:
    """``dvc add`` what is pending, then push every pointer of the run; returns counts and the time taken."""
    from dvc.repo import Repo

    # DVC's "git add these pointers" hint after every add would bury the flow's log (the README says it once)
    logging.getLogger("dvc.repo.scm_context").setLevel(logging.WARNING)

    t0 = time.monotonic()
    root = dvc_root(run)

    def add_and_push() -> tuple[int, int]:
        # computed inside the retry: after a wait for the lock, what is pending may have changed
        targets = pending(run, k, last, cfg.trainer.checkpoint_every)
        if cfg.tracking.dvc_resume_state == "last":
            leave_out_resume_state(run, [p for p in targets if p.parent == run.state(0).parent], last)
        if targets:
            with Repo(str(root)) as repo:
                repo.add([str(p.resolve()) for p in targets])
        pushed = push_with_deadline(root, [str(p.resolve()) for p in pointers(run)], cfg.tracking.dvc_remote,
                                    cfg.tracking.dvc_push_timeout_s)
        return len(targets), pushed

    added, pushed = when_unlocked(root, add_and_push)
    return {"dvc/added": float(added), "dvc/pushed_files": float(pushed), "timing_s/dvc": time.monotonic() - t0}


def _worth_retrying(task: Any, task_run: Any, state: Any) -> bool:
    """A push that timed out is not retried at once: the pause decides when the remote is tried again."""
    return not isinstance(state.result(raise_on_failure=False), PushStalled)


# the push has its own deadline (tracking.dvc_push_timeout_s); other failures (a full remote, the lock) are retried
@task(name="version_iteration", retries=2, retry_delay_seconds=2, retry_condition_fn=_worth_retrying,
      cache_policy=NO_CACHE, persist_result=False)
def version_iteration(cfg: Config, run: RunDir, k: int, last: int) -> dict[str, float]:
    return version(cfg, run, k, last)


def status(run: RunDir) -> dict[str, Any]:
    """``dvc status`` of the run's pointers: {} when the workspace matches what was versioned."""
    from dvc.repo import Repo

    with Repo(str(dvc_root(run))) as repo:
        return repo.status(targets=[str(p.resolve()) for p in pointers(run)])


def version_paths(paths: list[Path], remote: str | None, push_timeout_s: float) -> dict[str, Any]:
    """``dvc add`` + push of files or folders outside run directories (the SFT demos and checkpoint). A path a
    ``dvc.yaml`` stage declares as its output is left to that stage (``dvc repro`` / ``dvc commit``), since DVC
    refuses to track one path twice. ``remote`` and ``push_timeout_s`` are the config's (tracking.dvc_remote,
    tracking.dvc_push_timeout_s)."""
    from dvc.exceptions import NotDvcRepoError, OutputNotFoundError
    from dvc.repo import Repo

    logging.getLogger("dvc.repo.scm_context").setLevel(logging.WARNING)
    t0 = time.monotonic()
    first = paths[0].resolve()
    try:
        root = Repo.find_root(str(first.parent))
    except NotDvcRepoError:
        raise VersioningError(f"{first} is not inside a DVC repository: run `dvc init` in the project, or set "
                              f"tracking.dvc=false") from None
    def add_and_push() -> tuple[list[str], list[str], int]:
        added, staged = [], []
        with Repo(root) as repo:
            for p in paths:
                try:
                    outs = repo.find_outs_by_path(str(p.resolve()))
                except OutputNotFoundError:
                    outs = []
                (staged if any(o.stage.cmd for o in outs) else added).append(str(p.resolve()))
            if added:
                repo.add(added)
        pushed = push_with_deadline(Path(root), [f"{p}.dvc" for p in added], remote, push_timeout_s) if added else 0
        return added, staged, pushed

    added, staged, pushed = when_unlocked(Path(root), add_and_push)
    return {"added": added, "left_to_dvc_yaml": staged, "pushed_files": pushed,
            "time_s": time.monotonic() - t0}


def dvc_revision(run: RunDir) -> str:
    """One id for everything the run has DVC-versioned so far: a hash over its pointers' content hashes (the
    per-iteration ``dvc/...`` tags say which object each iteration is)."""
    h = hashlib.sha256()
    for p in sorted(run.root.rglob("*.dvc")):
        h.update(f"{p.relative_to(run.root)}={dvc_md5(run, p.with_suffix(''))}\n".encode())
    return h.hexdigest()[:16]


def dvc_md5(run: RunDir, path: Path) -> str | None:
    """The content hash DVC recorded for a versioned path (what ``dvc checkout`` restores), or None."""
    p = run.pointer(path)
    if not p.is_file():
        return None
    outs = (yaml.safe_load(p.read_text()) or {}).get("outs") or [{}]
    return outs[0].get("md5")
