"""Maze: walk from the start to the goal on a grid with walls. Deterministic moves; a move into a wall or off the
grid keeps the player in place. Added by following docs/extending.md (env file, one ENV_TYPES line, a TagSpec, a
demonstration solver, tests)."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
from gymnasium import spaces

from ragen.envs.base import TextEnv, text_space

ACTION_LOOKUP: dict[int, str] = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}
DELTAS: dict[int, tuple[int, int]] = {1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}
WALL, OPEN, START, GOAL = "#", ".", "S", "G"
# what the agent sees: the player and the goal drawn over the open cells
DEFAULT_GRID_VOCAB: dict[str, str] = {"#": "wall", ".": "empty", "P": "player", "G": "goal", "√": "player on goal"}


def shortest_path(layout: list[str]) -> list[int] | None:
    """The fewest actions (ids of ACTION_LOOKUP) from S to G, by breadth-first search; None when G is walled off.
    Ties go to the lower action id, so the plan of a layout is unique."""
    rows, cols = len(layout), len(layout[0])
    start = next((r, c) for r in range(rows) for c in range(cols) if layout[r][c] == START)
    parent: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if layout[cell[0]][cell[1]] == GOAL:
            plan = []
            while parent[cell] is not None:
                cell, a = parent[cell]  # type: ignore[misc]
                plan.append(a)
            return plan[::-1]
        for a, (dr, dc) in DELTAS.items():
            nr, nc = cell[0] + dr, cell[1] + dc
            if 0 <= nr < rows and 0 <= nc < cols and layout[nr][nc] != WALL and (nr, nc) not in parent:
                parent[(nr, nc)] = (cell, a)
                queue.append((nr, nc))
    return None


def check_settings(size: int, p_open: float, min_distance: int) -> None:
    if size < 2:
        raise ValueError(f"size must be >= 2, got {size}")
    if not 0.2 <= p_open <= 1.0:  # sparser grids almost never connect: generation would spin
        raise ValueError(f"p_open (probability of an open cell) must be in [0.2, 1], got {p_open}")
    if not 1 <= min_distance <= 2 * (size - 1):
        raise ValueError(f"min_distance must be in [1, {2 * (size - 1)}] on a {size}x{size} grid, got {min_distance}")


def random_layout(size: int, p_open: float, min_distance: int, rng: np.random.Generator) -> list[str]:
    """Each cell open with probability ``p_open``; distinct start and goal at least ``min_distance`` moves apart;
    resampled until such a path exists."""
    check_settings(size, p_open, min_distance)
    while True:
        board = [[OPEN if x else WALL for x in row] for row in rng.random((size, size)) < p_open]
        sr, sc, gr, gc = (int(x) for x in rng.integers(0, size, size=4))
        if (sr, sc) == (gr, gc):
            continue
        board[sr][sc], board[gr][gc] = START, GOAL
        layout = ["".join(row) for row in board]
        plan = shortest_path(layout)
        if plan is not None and len(plan) >= min_distance:
            return layout


class MazeEnv(TextEnv):
    """Reach the goal G. Actions 1 Up, 2 Down, 3 Left, 4 Right. Reward 1 on reaching the goal (which ends the
    episode), else 0; truncated after ``max_steps`` moves. ``reset(options={"layout": [...]})`` uses a given grid
    (rows of S . # G). Nothing is random after reset, so group members share everything but their own answers."""

    def __init__(self, size: int = 6, p_open: float = 0.7, min_distance: int = 3, max_steps: int = 100,
                 render_mode: str | None = None) -> None:
        super().__init__(render_mode)
        self.size, self.p_open, self.min_distance, self.max_steps = int(size), float(p_open), int(min_distance), \
            int(max_steps)
        check_settings(self.size, self.p_open, self.min_distance)
        self.action_space = spaces.Discrete(4, start=1)
        self.observation_space = text_space(self.size * (self.size + 1), DEFAULT_GRID_VOCAB)
        self.layout: list[str] | None = None
        self.player = (0, 0)
        self.num_env_steps = 0

    @property
    def action_lookup(self) -> dict[int, str]:
        return dict(ACTION_LOOKUP)

    def agent_cell(self) -> tuple[int, int] | None:
        return None if self.layout is None else self.player

    @property
    def goal(self) -> tuple[int, int]:
        if self.layout is None:
            raise RuntimeError("call reset() first")
        return next((r, c) for r, row in enumerate(self.layout) for c, ch in enumerate(row) if ch == GOAL)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        rng = self._seed_streams(seed, options)
        layout = (options or {}).get("layout") or random_layout(self.size, self.p_open, self.min_distance, rng)
        if len(layout) != self.size or any(len(row) != self.size for row in layout) or \
                "".join(layout).count(START) != 1 or "".join(layout).count(GOAL) != 1:
            raise ValueError(f"layout must be {self.size} rows of {self.size} cells of S . # G, one S and one G")
        self.layout = list(layout)
        self.player = next((r, c) for r, row in enumerate(layout) for c, ch in enumerate(row) if ch == START)
        self.num_env_steps = 0
        return self.render_text(), {"success": False}

    def optimal_length(self) -> int | None:
        plan = self.plan()
        return None if plan is None else len(plan)

    def plan(self) -> list[int] | None:
        """The shortest action sequence from where the player stands now."""
        if self.player == self.goal:
            return []
        here = [list(row.replace(START, OPEN)) for row in self.layout]  # type: ignore[union-attr]
        here[self.player[0]][self.player[1]] = START
        return shortest_path(["".join(row) for row in here])

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.layout is None:
            raise RuntimeError("call reset() before step()")
        a = self._check_action(action)
        dr, dc = DELTAS[a]
        r, c = self.player[0] + dr, self.player[1] + dc
        moved = 0 <= r < self.size and 0 <= c < self.size and self.layout[r][c] != WALL
        if moved:
            self.player = (r, c)
        self.num_env_steps += 1
        success = self.player == self.goal
        truncated = not success and self.num_env_steps >= self.max_steps
        info = {"action_is_effective": moved, "action_is_valid": True, "success": success}
        return self.render_text(), 1.0 if success else 0.0, success, truncated, info

    def render_text(self) -> str:
        if self.layout is None:
            raise RuntimeError("call reset() first")
        rows = []
        for r, row in enumerate(self.layout):
            cells = []
            for c, ch in enumerate(row):
                if (r, c) == self.player:
                    cells.append("√" if ch == GOAL else "P")
                else:
                    cells.append(OPEN if ch == START else ch)
            rows.append("".join(cells))
        return "\n".join(rows)
