"""Which checkpoints a run keeps: every iteration writes one (the resume point); kept are the latest, the best by
validation score, every ``checkpoint_every``-th, and every one DVC versioned (``states_to_version``: the
checkpoint_every-th, the final one and each new best). ``prune_states`` deletes the others."""

from __future__ import annotations

import shutil

from ragen.run.rundir import RunDir


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
