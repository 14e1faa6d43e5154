"""Which checkpoints a run keeps: every iteration writes one (the resume point); kept are the latest, the best by
validation score, every ``checkpoint_every``-th, and every one DVC versioned (``states_to_version``: the
checkpoint_every-th, the final one and each new best). ``prune_states`` deletes the others, and under
``trainer.resume_state=latest`` the resume state of every kept one but the latest."""

from __future__ import annotations

import shutil

from ragen.run.rundir import RESUME_STATE, RunDir


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


def prune_states(run: RunDir, checkpoint_every: int, best: int | None, *, resume_state: str = "every_checkpoint"
                 ) -> list[int]:
    """Delete the states the retention rule drops (never a versioned one: its pointer would dangle and
    ``dvc status`` would report it deleted); with ``resume_state="latest"``, also the resume state of every kept
    state but the latest, except where a DVC pointer covers it (``pointer_covers_resume_state``). Returns the
    pruned iterations."""
    done = run.completed()
    keep = retained_states(done, checkpoint_every, best)
    pruned = []
    for k in done:
        if k not in keep and run.state(k).is_dir() and not run.is_versioned(run.state(k)):
            shutil.rmtree(run.state(k))
            pruned.append(k)
    if resume_state == "latest" and done:
        for k in sorted(keep - {done[-1]}):
            if not pointer_covers_resume_state(run, k):
                strip_resume_state(run, k)
    return pruned


def pointer_covers_resume_state(run: RunDir, k: int) -> bool:
    """Whether iteration k's checkpoint is versioned with its resume state: a pointer, and the run's .dvcignore
    (tracking.dvc_resume_state=last) does not leave each of its resume parts out."""
    st = run.state(k)
    if not run.is_versioned(st):
        return False
    ignore = run.root / ".dvcignore"
    left_out = set(ignore.read_text().splitlines()) if ignore.is_file() else set()
    rel = st.relative_to(run.root).as_posix()
    return any((st / part).is_dir() and f"/{rel}/{part}/" not in left_out for part in RESUME_STATE)


def strip_resume_state(run: RunDir, k: int) -> list[str]:
    """Delete iteration k's resume state (``RESUME_STATE``): the checkpoint keeps what evaluation and export load.
    Returns the parts deleted."""
    gone = []
    for part in RESUME_STATE:
        p = run.state(k) / part
        if p.is_dir():
            shutil.rmtree(p)
            gone.append(part)
    return gone
