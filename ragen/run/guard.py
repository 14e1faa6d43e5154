"""The collapse guard: the Echo Trap warnings (ragen.algos.echo_trap) turned into an action. When the configured
signals stay on for ``guard.patience`` iterations, the run rolls back to its last healthy checkpoint (one taken
before the signals came on; the base model when there is none), applies a remedy (learning rates scaled by
``guard.lr_scale``, then ``guard.overrides``) and trains on from there. After ``guard.max_rollbacks`` rollbacks the
next trip stops the run with ``GuardGaveUp``.

Nothing is deleted: the rolled-back iterations and checkpoints move to ``guard/rollback-<n>/`` in the run directory,
and ``guard.json`` records every event. A restarted run re-applies the remedies from ``guard.json``, so it continues
with the settings it had when it stopped."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ragen.config import Config, apply_overrides
from ragen.io import write_json
from ragen.run.rundir import MARKER, RunDir

GUARD_FILE = "guard.json"
ARCHIVE = "guard"
SIGNALS = {"std_collapse": "echo/std_collapse", "entropy_rise": "echo/entropy_rise",
           "entropy_shift": "echo/entropy_shift", "grad_spike": "echo/grad_spike"}


class GuardGaveUp(RuntimeError):
    """The run collapsed again after the allowed rollbacks."""


# Not a setting: an iteration in which every actor step was skipped for a non-finite loss or gradient (a NaN/inf
# storm: ragen.train.update skips such steps, so the weights stay clean) trained nothing. When that persists it is
# a collapse whichever Echo Trap signals are chosen, and the Echo Trap statistics themselves go NaN then.
NONFINITE = "nonfinite_steps"
SKIPPED = "actor/skipped"  # the share of the iteration's actor steps skipped as non-finite


def signals_on(diag: Mapping[str, float], signals: Sequence[str]) -> list[str]:
    """The configured signals whose Echo Trap flag is on in one iteration's metrics, and ``nonfinite_steps`` when
    no actor step of the iteration had a finite loss and gradient."""
    on = [s for s in signals if diag.get(SIGNALS[s], 0.0) >= 1.0 and math.isfinite(diag.get(SIGNALS[s], 0.0))]
    return [*on, NONFINITE] if diag.get(SKIPPED, 0.0) >= 1.0 else on


def streak(history: Sequence[Mapping[str, float]], signals: Sequence[str]) -> int:
    """How many iterations at the end of ``history`` (oldest first) have at least one configured signal on."""
    n = 0
    for m in reversed(history):
        if not signals_on(m, signals):
            break
        n += 1
    return n


@dataclass
class Rollback:
    at: int  # the iteration whose diagnostics tripped the guard
    to: int  # the healthy iteration training continues after (-1: the start of the run)
    signals: list[str]
    lr_factor: float  # cumulative learning-rate factor from this rollback on
    overrides: list[str]
    archived: str  # where the rolled-back iterations went, relative to the run directory
    pending: bool = False  # recorded, its iterations not all archived yet (a crash in between: finished on restart)


@dataclass
class GuardState:
    rollbacks: list[Rollback] = field(default_factory=list)

    @classmethod
    def read(cls, run: RunDir) -> GuardState:
        p = run.root / GUARD_FILE
        if not p.is_file():
            return cls()
        try:
            data = json.loads(p.read_text())
            return cls([Rollback(**r) for r in data.get("rollbacks", [])])
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{p} is damaged ({e}); it records the guard's rollbacks: restore it from DVC or git, "
                             f"or delete it to continue without the remedies it applied") from None

    @property
    def floor(self) -> int:
        """Where the last rollback resumed after (-1: the start of the run): the guard never goes back past it."""
        return self.rollbacks[-1].to if self.rollbacks else -1

    @property
    def lr_factor(self) -> float:
        """The learning-rate factor in effect (the product of one ``lr_scale`` per rollback)."""
        return self.rollbacks[-1].lr_factor if self.rollbacks else 1.0

    def write(self, run: RunDir) -> None:
        write_json(run.root / GUARD_FILE, {"rollbacks": [r.__dict__ for r in self.rollbacks]})


def effective_config(cfg: Config, state: GuardState) -> Config:
    """The run's config with the remedies of every rollback so far (what training continues with)."""
    if not state.rollbacks:
        return cfg
    f = state.lr_factor
    over = [f"actor.lr={cfg.actor.lr * f!r}", f"critic.lr={cfg.critic.lr * f!r}"]
    for r in state.rollbacks:
        over += r.overrides
    return apply_overrides(cfg, over)


def healthy_iteration(run: RunDir, first_bad: int, floor: int) -> int:
    """The newest complete checkpoint from before the policy went bad, or ``floor`` itself (-1: the start of the
    run, the base model). Iteration k's signals describe the policy of checkpoint k-1 (its rollouts were sampled
    from it, its entropy and gradients measured on it), so when they first came on at ``first_bad`` the bad
    policy is checkpoint first_bad-1 and the healthy one is older."""
    j = run.last_good_state(first_bad - 1)
    return j if j is not None and j > floor else floor


def roll_back(run: RunDir, cfg: Config, state: GuardState, at: int, first_bad: int, signals: list[str]) -> Rollback:
    """Move iterations (and checkpoints) after the healthy one into the archive, record the event, return it.
    Raises ``GuardGaveUp`` when the rollbacks are used up."""
    g = cfg.guard
    if len(state.rollbacks) >= g.max_rollbacks:
        done = ", ".join(f"{r.at}->{r.to + 1}" for r in state.rollbacks) or "none"
        raise GuardGaveUp(
            f"run {run.root}: the collapse guard tripped at iteration {at} ({', '.join(signals)}) after "
            f"{len(state.rollbacks)} rollback(s) (iterations {done}), the most guard.max_rollbacks="
            f"{g.max_rollbacks} allows; the run stops here. Its history is in {run.root / GUARD_FILE} and "
            f"{run.root / ARCHIVE}/. Try a lower actor.lr, stronger filtering (algorithm.filter_ratio), or "
            f"another seed; or raise guard.max_rollbacks")
    to = healthy_iteration(run, first_bad, state.floor)
    n = len(state.rollbacks) + 1
    dest = run.root / ARCHIVE / f"rollback-{n}"
    dest.mkdir(parents=True, exist_ok=True)
    event = Rollback(at=at, to=to, signals=list(signals), lr_factor=state.lr_factor * g.lr_scale,
                     overrides=list(g.overrides), archived=str(dest.relative_to(run.root)), pending=True)
    state.rollbacks.append(event)
    state.write(run)  # the intent first: a crash while archiving is finished by the next start
    _archive_after(run, event)
    event.pending = False
    state.write(run)
    return event


def _archive_after(run: RunDir, event: Rollback) -> None:
    """Move the iterations after ``event.to`` into its archive, newest first (a crash in between leaves the
    completed ones a prefix 0..j, never a hole); what already moved is skipped."""
    for k in range(event.at, event.to, -1):
        _archive(run, k, run.root / event.archived)


def finish_pending(run: RunDir) -> None:
    """Complete a rollback a crash interrupted (recorded in guard.json, not all archived): before the run's
    resume point is read, whether or not the guard is on now."""
    state = GuardState.read(run)
    for event in state.rollbacks:
        if event.pending:
            _archive_after(run, event)
            event.pending = False
            state.write(run)


def _archive(run: RunDir, k: int, dest: Path) -> None:
    """Iteration k's data folder and checkpoint into ``dest``; the completion marker goes first, so a crash in
    between leaves an incomplete (recomputed) iteration, never a complete one missing its checkpoint."""
    it, st = run.iteration(k), run.state(k)
    if (it / MARKER).is_file():
        (it / MARKER).rename(it / (MARKER + ".rolled-back"))
    for path, name in ((st, f"checkpoint_{k:05d}"), (it, it.name)):
        if path.exists():
            target = dest / name
            if target.exists():
                raise FileExistsError(f"{target} exists: the guard archive of {run.root} was edited by hand")
            path.rename(target)
        pointer = run.pointer(path)
        if pointer.is_file():  # the DVC pointer describes what moved away: keep it with it
            pointer.rename(dest / (name + ".dvc"))

