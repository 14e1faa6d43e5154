"""Sokoban as a gymnasium env with text observations (gym-sokoban push rules and reward constants)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gymnasium import spaces

from ragen.envs.base import TextEnv, text_space
from ragen.envs.seeding import layout_rng
from ragen.envs.sokoban.generator import generate_room
from ragen.envs.sokoban.room import ACTION_LOOKUP, DEFAULT_GRID_LOOKUP, TARGET, WALL, Room
from ragen.envs.sokoban.solver import optimal_length

PENALTY_FOR_STEP = -0.1
REWARD_BOX_ON_TARGET = 1.0
PENALTY_BOX_OFF_TARGET = -1.0
REWARD_FINISHED = 10.0
# a difficulty band (max_optimal_moves): seed s draws its room from the candidate seeds s * BAND_STRIDE + j, the
# first whose optimal solution is short enough. Distinct seeds own disjoint candidates, so disjoint seed ranges
# (training vs panel) stay disjoint rooms, and consecutive seeds never land on the same room.
BAND_STRIDE = 64


class SokobanEnv(TextEnv):
    """Push every box onto a target. Actions 1 Up, 2 Down, 3 Left, 4 Right (push semantics).

    Every executed action costs 0.1, including no-ops into walls or blocked boxes; +1 / -1 when the number of
    boxes on targets rises / falls; +10 when all boxes are on targets (terminated). The episode is truncated
    after ``max_steps`` actions. ``reset(options={"room": Room | text})`` starts from a given room.
    ``max_optimal_moves`` = N keeps only rooms the solver solves in at most N moves (a difficulty band chosen by
    the solver, never by the model; see ``BAND_STRIDE``).
    """

    def __init__(self, dim: tuple[int, int] = (6, 6), num_boxes: int = 1, search_depth: int = 300,
                 max_steps: int = 100, num_gen_steps: int | None = None,
                 grid_lookup: Mapping[int, str] | None = None, max_optimal_moves: int | None = None,
                 render_mode: str | None = None) -> None:
        super().__init__(render_mode)
        if max_optimal_moves is not None and int(max_optimal_moves) < 1:
            raise ValueError(f"max_optimal_moves must be >= 1 (or None: every room), got {max_optimal_moves}")
        self.max_optimal_moves = None if max_optimal_moves is None else int(max_optimal_moves)
        self.dim = (int(dim[0]), int(dim[1]))
        self.num_boxes = int(num_boxes)
        self.search_depth = int(search_depth)
        self.max_steps = int(max_steps)
        self.num_gen_steps = num_gen_steps
        self.grid_lookup = {int(k): str(v) for k, v in (grid_lookup or DEFAULT_GRID_LOOKUP).items()}
        if sorted(self.grid_lookup) != list(range(7)):
            raise ValueError(f"grid_lookup must map codes 0..6 to symbols, got keys {sorted(self.grid_lookup)}")
        self.action_space = spaces.Discrete(4, start=1)
        h, w = self.dim
        self.observation_space = text_space(h * (w + 1), self.grid_lookup.values())
        self.room: Room | None = None
        self.num_env_steps = 0

    @property
    def action_lookup(self) -> dict[int, str]:
        return dict(ACTION_LOOKUP)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        rng = self._seed_streams(seed, options)
        given = (options or {}).get("room")
        if given is None and self.max_optimal_moves is not None and seed is not None:
            room = self._band_room(int(seed))
        elif given is None:
            room = generate_room(self.dim, self.num_boxes, self.search_depth, rng, self.num_gen_steps)
        elif isinstance(given, Room):
            room = given
        else:
            room = Room.parse(str(given), self.grid_lookup)
        self.room = room
        self._boxes = set(room.boxes)
        self._player = room.player
        self.num_env_steps = 0
        self._boxes_on_target = sum(1 for b in self._boxes if room.fixed[b] == TARGET)
        return self.render_text(), {"success": self._solved()}

    def _band_room(self, seed: int) -> Room:
        assert self.max_optimal_moves is not None
        for j in range(BAND_STRIDE):
            room = generate_room(self.dim, self.num_boxes, self.search_depth, layout_rng(seed * BAND_STRIDE + j),
                                 self.num_gen_steps)
            n = optimal_length(room)
            if n is not None and n <= self.max_optimal_moves:
                return room
        raise RuntimeError(f"none of seed {seed}'s {BAND_STRIDE} candidate rooms is solvable in at most "
                           f"{self.max_optimal_moves} moves; raise max_optimal_moves")

    def _solved(self) -> bool:
        assert self.room is not None
        return self._boxes_on_target == len(self._boxes)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.room is None:
            raise RuntimeError("call reset() before step()")
        a = self._check_action(action)
        room = self.room
        w = room.width
        d = (-w, w, -1, 1)[a - 1]
        self.num_env_steps += 1
        before = self._player
        nxt = before + d
        if room.fixed[nxt] != WALL:
            if nxt in self._boxes:
                beyond = nxt + d
                if room.fixed[beyond] != WALL and beyond not in self._boxes:
                    self._boxes.remove(nxt)
                    self._boxes.add(beyond)
                    self._player = nxt
            else:
                self._player = nxt
        reward = PENALTY_FOR_STEP
        on_target = sum(1 for b in self._boxes if room.fixed[b] == TARGET)
        if on_target > self._boxes_on_target:
            reward += REWARD_BOX_ON_TARGET
        elif on_target < self._boxes_on_target:
            reward += PENALTY_BOX_OFF_TARGET
        self._boxes_on_target = on_target
        solved = self._solved()
        if solved:
            reward += REWARD_FINISHED
        truncated = not solved and self.num_env_steps >= self.max_steps
        info = {"action_is_effective": self._player != before, "action_is_valid": True, "success": solved}
        return self.render_text(), reward, solved, truncated, info

    def current_room(self) -> Room:
        if self.room is None:
            raise RuntimeError("call reset() first")
        return Room(self.room.height, self.room.width, self.room.fixed, self._player, tuple(sorted(self._boxes)))

    def render_text(self) -> str:
        return self.current_room().render(self.grid_lookup)

    def agent_cell(self) -> tuple[int, int] | None:
        if self.room is None:
            return None
        return divmod(self._player, self.room.width)

    def optimal_length(self) -> int | None:
        """BFS-optimal number of moves that solves the current room."""
        return optimal_length(self.current_room())
