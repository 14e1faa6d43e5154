"""Env tags: each tag is an env type plus its settings and prompt pieces (docs/environments.md; the original's
envs.yaml)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import gymnasium as gym

from ragen.envs import frozen_lake as fl
from ragen.envs import maze
from ragen.envs.base import TextEnv
from ragen.envs.sokoban.room import ACTION_LOOKUP as SOKOBAN_ACTIONS
from ragen.envs.sokoban.room import DEFAULT_GRID_VOCAB as SOKOBAN_VOCAB
from ragen.envs.sokoban.room import grid_vocab_for

# The one table of env types: gymnasium id and entry point (a new env type is one line here, its TagSpecs below,
# and a demonstration solver in ragen/sft/demos.py's SOLVERS)
ENV_TYPES: dict[str, tuple[str, str]] = {
    "sokoban": ("ragen/Sokoban-v0", "ragen.envs.sokoban.env:SokobanEnv"),
    "frozen_lake": ("ragen/FrozenLake-v0", "ragen.envs.frozen_lake:FrozenLakeEnv"),
    "bandit": ("ragen/Bandit-v0", "ragen.envs.bandit:BanditEnv"),
    "maze": ("ragen/Maze-v0", "ragen.envs.maze:MazeEnv"),
}
ENV_IDS = {env_type: env_id for env_type, (env_id, _) in ENV_TYPES.items()}

SOKOBAN_INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
    "When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box through a wall, and you cannot pull a box. "
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>"
)
FROZEN_LAKE_INSTRUCTION = (
    "You are solving the FrozenLake puzzle. Avoid the holes and go to the target. "
    "You may move in an unintended direction because the ice is slippery. "
    "Example answer format: <think>To avoid the hole and reach the target, I should go left then up."
    "</think><answer>Left || Up</answer>"
)
# the original's is_slippery=False: every move goes where it says
FROZEN_LAKE_NO_SLIP_INSTRUCTION = FROZEN_LAKE_INSTRUCTION.replace(
    "You may move in an unintended direction because the ice is slippery. ", "")
MAZE_INSTRUCTION = (
    "You are in a maze. Walk to the goal. Walls block the way: a move into a wall or off the grid keeps you where "
    "you are. The answer should be a sequence of actions, like <answer>Up || Right || Right</answer>"
)
DIFF_VOCAB_LOOKUP = {0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"}


def _frozen(m: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    return None if m is None else MappingProxyType(dict(m))


@dataclass(frozen=True)
class TagSpec:
    """Everything one tag needs: which env, its constructor arguments, budgets and prompt pieces.

    ``grid_vocab`` and ``prompt_actions`` are what the first user message shows; ``None`` shows nothing
    (Bandit carries its rules in the state text). ``legacy_legend`` (DiffVocab) shows the default Sokoban
    legend over the new-symbol grid, as the original code did.
    """

    tag: str
    env_type: str
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_actions_per_traj: int = 10
    max_tokens: int = 100
    instruction: str = ""
    grid_vocab: Mapping[str, str] | None = None
    prompt_actions: tuple[str, ...] | None = None
    legacy_legend: bool = False

    def __post_init__(self) -> None:
        if self.env_type not in ENV_IDS:
            raise ValueError(f"tag {self.tag}: env_type must be one of {sorted(ENV_IDS)}, got {self.env_type!r}")
        if self.max_actions_per_traj < 1:
            raise ValueError(f"tag {self.tag}: max_actions_per_traj must be >= 1")
        object.__setattr__(self, "env_kwargs", _frozen(self.env_kwargs))
        object.__setattr__(self, "grid_vocab", _frozen(self.grid_vocab))

    @property
    def env_id(self) -> str:
        return ENV_IDS[self.env_type]

    @property
    def shown_grid_vocab(self) -> Mapping[str, str] | None:
        return SOKOBAN_VOCAB if (self.legacy_legend and self.env_type == "sokoban") else self.grid_vocab

    def make(self, **overrides: Any) -> TextEnv:
        """A fresh env instance (unwrapped: the rollout loop drives many envs and checks actions itself)."""
        return gym.make(self.env_id, **{**self.env_kwargs, **overrides}).unwrapped  # type: ignore[return-value]

    def replace(self, **changes: Any) -> TagSpec:
        return dataclasses.replace(self, **changes)


# the difficulty band of SimpleSokoban rooms (SimpleSokobanBand): solvable in at most this many moves, chosen so
# that the SFT warm-start solves 30-60% of them before any RL (docs/environments.md has the measurement)
BAND_MAX_MOVES = 2


def _sokoban(tag: str, dim: tuple[int, int], boxes: int, depth: int, lookup: Mapping[int, str] | None = None,
             max_optimal_moves: int | None = None) -> TagSpec:
    kwargs: dict[str, Any] = {"dim": dim, "num_boxes": boxes, "search_depth": depth, "max_steps": 100}
    if max_optimal_moves is not None:
        kwargs["max_optimal_moves"] = max_optimal_moves
    if lookup is not None:
        kwargs["grid_lookup"] = dict(lookup)
    return TagSpec(tag, "sokoban", kwargs, 10, 100, SOKOBAN_INSTRUCTION,
                   grid_vocab_for(lookup) if lookup else SOKOBAN_VOCAB, tuple(SOKOBAN_ACTIONS.values()))


def _bandit(tag: str, lo: str, hi: str) -> TagSpec:
    return TagSpec(tag, "bandit", {"lo_arm_name": lo, "hi_arm_name": hi}, 1, 100, "")


BUILTIN_TAGS: dict[str, TagSpec] = {
    spec.tag: spec
    for spec in (
        _sokoban("SimpleSokoban", (6, 6), 1, 300),
        _sokoban("SimpleSokobanBand", (6, 6), 1, 300, max_optimal_moves=BAND_MAX_MOVES),
        _sokoban("LargerSokoban", (8, 8), 2, 10),
        _sokoban("SokobanDifferentGridVocab", (6, 6), 1, 30, DIFF_VOCAB_LOOKUP),
        TagSpec("FrozenLake", "frozen_lake", {"size": 4, "p": 0.8, "is_slippery": True}, 10, 100,
                FROZEN_LAKE_INSTRUCTION, fl.DEFAULT_GRID_VOCAB, tuple(fl.ACTION_LOOKUP.values())),
        TagSpec("FrozenLakeNoSlip", "frozen_lake", {"size": 4, "p": 0.8, "is_slippery": False}, 10, 100,
                FROZEN_LAKE_NO_SLIP_INSTRUCTION, fl.DEFAULT_GRID_VOCAB, tuple(fl.ACTION_LOOKUP.values())),
        TagSpec("Maze", "maze", {"size": 6, "p_open": 0.7, "min_distance": 3}, 10, 100, MAZE_INSTRUCTION,
                maze.DEFAULT_GRID_VOCAB, tuple(maze.ACTION_LOOKUP.values())),
        _bandit("Bandit", "Phoenix", "Dragon"),
        _bandit("BanditTest", "Trader", "Librarian"),
        _bandit("BanditTestRev", "Librarian", "Trader"),
        _bandit("BanditGeneralization", "Engineer", "Teacher"),
        _bandit("BanditGeneralizationRev", "Teacher", "Engineer"),
    )
}

_TAG_FIELDS = {f.name for f in dataclasses.fields(TagSpec)} - {"tag"}


def resolve_tags(custom: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, TagSpec]:
    """Built-in tags overlaid with ``custom``: ``{Tag: {base: OtherTag?, field: value, env_kwargs: {...}}}``.

    An existing tag is updated in place (``env_kwargs`` are merged); a new tag needs ``base``.
    """
    tags = dict(BUILTIN_TAGS)
    for name, raw in (custom or {}).items():
        settings = dict(raw)
        base_name = settings.pop("base", None)
        if base_name is None and name not in tags:
            raise ValueError(f"envs.custom.{name}: unknown tag; give 'base' (one of {sorted(tags)})")
        base_name = base_name or name
        if base_name not in tags:
            raise ValueError(f"envs.custom.{name}.base: unknown tag {base_name!r}; known: {sorted(tags)}")
        unknown = set(settings) - _TAG_FIELDS
        if unknown:
            raise ValueError(f"envs.custom.{name}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_TAG_FIELDS)}")
        base = tags[base_name]
        if "env_kwargs" in settings:
            settings["env_kwargs"] = {**base.env_kwargs, **settings["env_kwargs"]}
        if "prompt_actions" in settings and settings["prompt_actions"] is not None:
            settings["prompt_actions"] = tuple(settings["prompt_actions"])
        spec = base.replace(tag=name, **settings)
        try:  # constructor arguments are checked now, not at the first rollout
            spec.make()
        except TypeError as e:
            raise ValueError(f"envs.custom.{name}.env_kwargs: {e}") from None
        tags[name] = spec
    return tags


def get_tag(tag: str, tags: Mapping[str, TagSpec] | None = None) -> TagSpec:
    table = BUILTIN_TAGS if tags is None else tags
    if tag not in table:
        raise KeyError(f"unknown env tag {tag!r}; known tags: {', '.join(sorted(table))}")
    return table[tag]


def register_envs() -> None:
    """Register the env types with gymnasium (idempotent)."""
    for env_id, entry_point in ENV_TYPES.values():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True)
