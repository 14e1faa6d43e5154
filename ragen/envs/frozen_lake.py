"""FrozenLake with text observations. Dynamics (slip rule, transitions) are gymnasium's own FrozenLakeEnv."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake

from ragen.envs.base import TextEnv, text_space

ACTION_LOOKUP: dict[int, str] = {1: "Left", 2: "Down", 3: "Right", 4: "Up"}
_TO_GYM_ACTION = {1: 0, 2: 1, 3: 2, 4: 3}  # gymnasium: 0 Left, 1 Down, 2 Right, 3 Up
_DELTAS = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}

# Render codes: 0 player, 1 frozen, 2 hole, 3 goal, 4 player in hole, 5 player on goal.
DEFAULT_GRID_LOOKUP: dict[int, str] = {0: "P", 1: "_", 2: "O", 3: "G", 4: "X", 5: "√"}
DEFAULT_GRID_VOCAB: dict[str, str] = {
    "P": "player", "_": "empty", "O": "hole", "G": "goal", "X": "player in hole", "√": "player on goal",
}


def shortest_path_length(desc: list[str]) -> int | None:
    """Fewest moves from S to G avoiding holes when nothing slips (None if G is unreachable)."""
    size = len(desc)
    start = next((r, c) for r in range(size) for c in range(size) if desc[r][c] == "S")
    dist = {start: 0}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if desc[r][c] == "G":
            return dist[(r, c)]
        for dr, dc in _DELTAS.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size and desc[nr][nc] != "H" and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return None


def random_map(size: int, p: float, rng: np.random.Generator) -> list[str]:
    """Each cell frozen with probability ``p``; distinct random start and goal; resampled until a path exists."""
    if size < 2:
        raise ValueError(f"size must be >= 2, got {size}")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p (probability of a frozen cell) must be in (0, 1], got {p}")
    while True:
        frozen = rng.random((size, size)) < p
        board = [["F" if f else "H" for f in row] for row in frozen]
        while True:
            sr, sc, gr, gc = (int(x) for x in rng.integers(0, size, size=4))
            if (sr, sc) != (gr, gc):
                break
        board[sr][sc] = "S"
        board[gr][gc] = "G"
        desc = ["".join(row) for row in board]
        if shortest_path_length(desc) is not None:
            return desc


class FrozenLakeEnv(TextEnv):
    """Reach the goal without falling into a hole. Actions 1 Left, 2 Down, 3 Right, 4 Up.

    Slippery ice: the move goes in the intended direction or either perpendicular one, 1/3 each (gymnasium's
    rule); a move off the grid stays in place. Reward 1 at the goal, else 0; a hole or the goal terminates.
    ``reset(options={"desc": [...]})`` uses a given map (rows of S/F/H/G).
    """

    def __init__(self, size: int = 4, p: float = 0.8, is_slippery: bool = True, max_steps: int | None = None,
                 render_mode: str | None = None) -> None:
        super().__init__(render_mode)
        self.size = int(size)
        self.p = float(p)
        self.is_slippery = bool(is_slippery)
        self.max_steps = max_steps
        self.action_space = spaces.Discrete(4, start=1)
        self.observation_space = text_space(self.size * (self.size + 1), DEFAULT_GRID_LOOKUP.values())
        self._lake: GymFrozenLake | None = None
        self.num_env_steps = 0

    @property
    def action_lookup(self) -> dict[int, str]:
        return dict(ACTION_LOOKUP)

    @property
    def desc(self) -> list[str]:
        if self._lake is None:
            raise RuntimeError("call reset() first")
        return [row.tobytes().decode() for row in self._lake.desc]

    def optimal_length(self) -> int | None:
        """Length of the shortest slip-free path to the goal (None when the map has none)."""
        return shortest_path_length(self.desc)

    @property
    def position(self) -> tuple[int, int]:
        if self._lake is None:
            raise RuntimeError("call reset() first")
        return divmod(int(self._lake.s), self.size)

    def agent_cell(self) -> tuple[int, int] | None:
        return None if self._lake is None else self.position

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        rng = self._seed_streams(seed, options)
        desc = (options or {}).get("desc") or random_map(self.size, self.p, rng)
        if len(desc) != self.size or any(len(row) != self.size for row in desc):
            raise ValueError(f"desc must be {self.size} rows of {self.size} cells")
        self._lake = GymFrozenLake(desc=list(desc), is_slippery=self.is_slippery)
        self._lake.np_random = self.np_random  # slips draw from this env's dynamics stream
        start = "".join(desc).index("S")
        self._lake.s = start
        self._lake.lastaction = None
        self.num_env_steps = 0
        return self.render_text(), {"success": False}

    def _cell(self) -> str:
        r, c = self.position
        return self.desc[r][c]

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self._lake is None:
            raise RuntimeError("call reset() before step()")
        a = self._check_action(action)
        before = int(self._lake.s)
        _, reward, terminated, _, _ = self._lake.step(_TO_GYM_ACTION[a])
        self.num_env_steps += 1
        success = self._cell() == "G"
        truncated = (not terminated and self.max_steps is not None and self.num_env_steps >= self.max_steps)
        info = {"action_is_effective": int(self._lake.s) != before, "action_is_valid": True, "success": success}
        return self.render_text(), float(reward), bool(terminated), truncated, info

    def render_text(self) -> str:
        desc = self.desc
        pr, pc = self.position
        rows = []
        for r, row in enumerate(desc):
            cells = []
            for c, ch in enumerate(row):
                if (r, c) == (pr, pc):
                    code = 4 if ch == "H" else 5 if ch == "G" else 0
                else:
                    code = 2 if ch == "H" else 3 if ch == "G" else 1
                cells.append(DEFAULT_GRID_LOOKUP[code])
            rows.append("".join(cells))
        return "\n".join(rows)
