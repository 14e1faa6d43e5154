"""The FrozenLake policy that maximises success under the slip rule, for the turn structure of the agent loop.

Within a turn the agent commits to a sequence of up to ``per_turn`` actions (open loop: it sees where it slipped
only at the next turn); across turns it reacts to the state. ``W[t, a](s)`` is the highest probability of
reaching the goal from cell s with t turns and a actions left; a turn's plan is the action sequence maximising
the expected ``W`` of the next turn. Exact dynamic programming over all sequences (4^per_turn per state), using
the env's own rule: the move goes in the intended or either perpendicular direction, 1/3 each (slip-free when
not slippery); off the grid stays in place; holes and the goal end the episode.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from ragen.envs.frozen_lake import _DELTAS, _TO_GYM_ACTION

ACTIONS = tuple(sorted(_TO_GYM_ACTION))  # env action ids 1 Left, 2 Down, 3 Right, 4 Up


def transition_matrices(desc: list[str], is_slippery: bool = True) -> dict[int, np.ndarray]:
    """P[a][s, s'] for each env action id; terminal cells (H, G) are absorbing."""
    size = len(desc)
    n = size * size
    out = {}
    for a in ACTIONS:
        g = _TO_GYM_ACTION[a]
        dirs = [(g - 1) % 4, g, (g + 1) % 4] if is_slippery else [g]
        P = np.zeros((n, n))
        for s in range(n):
            r, c = divmod(s, size)
            if desc[r][c] in "HG":
                P[s, s] = 1.0
                continue
            for d in dirs:
                dr, dc = _DELTAS[d]
                nr, nc = r + dr, c + dc
                if not (0 <= nr < size and 0 <= nc < size):
                    nr, nc = r, c
                P[s, nr * size + nc] += 1.0 / len(dirs)
        out[a] = P
    return out


@dataclass
class FrozenLakePlanner:
    """Optimal turn plans for one map. ``plan(cell, turns_left, actions_left)`` -> action ids for this turn."""

    desc: list[str]
    per_turn: int
    is_slippery: bool = True
    _P: dict[int, np.ndarray] = field(init=False, repr=False)
    _goal: np.ndarray = field(init=False, repr=False)
    _W: dict[tuple[int, int], np.ndarray] = field(init=False, repr=False, default_factory=dict)
    _seqs: dict[int, tuple[list[tuple[int, ...]], np.ndarray]] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.per_turn < 1:
            raise ValueError(f"per_turn must be >= 1, got {self.per_turn}")
        self._P = transition_matrices(self.desc, self.is_slippery)
        self._goal = np.array([ch == "G" for row in self.desc for ch in row], dtype=float)

    def _sequences(self, j: int) -> tuple[list[tuple[int, ...]], np.ndarray]:
        """All action sequences of length j (lexicographic) and their composed transition matrices."""
        if j not in self._seqs:
            seqs = list(itertools.product(ACTIONS, repeat=j))
            mats = np.stack([np.linalg.multi_dot([np.eye(len(self._goal)), *(self._P[a] for a in s)]) for s in seqs])
            self._seqs[j] = (seqs, mats)
        return self._seqs[j]

    def _options(self, turns: int, actions: int) -> list[tuple[tuple[int, ...], np.ndarray]]:
        """(sequence, success probability from every cell) for every plan this turn can make."""
        out = []
        for j in range(1, min(self.per_turn, actions) + 1):
            nxt = self.value(turns - 1, actions - j)
            seqs, mats = self._sequences(j)
            vals = mats @ nxt  # (sequences, cells)
            out.extend(zip(seqs, vals, strict=True))
        return out

    def value(self, turns: int, actions: int) -> np.ndarray:
        """W[turns, actions]: best success probability from each cell."""
        if turns <= 0 or actions <= 0:
            return self._goal.copy()
        key = (turns, actions)
        if key not in self._W:
            best = np.max(np.stack([v for _, v in self._options(turns, actions)]), axis=0)
            self._W[key] = np.maximum(best, self._goal)
        return self._W[key]

    def plan(self, cell: int, turns: int, actions: int) -> tuple[int, ...]:
        """The best sequence for this turn; ties go to the shorter plan (it reacts sooner), then the first."""
        if turns < 1 or actions < 1:
            raise ValueError("no turn or action left to plan")
        opts = self._options(turns, actions)
        top = max(v[cell] for _, v in opts)
        return next(s for s, v in opts if v[cell] >= top - 1e-12)

    def success_probability(self, cell: int, turns: int, actions: int) -> float:
        return float(self.value(turns, actions)[cell])
