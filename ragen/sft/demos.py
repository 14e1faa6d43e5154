"""Solver demonstrations for the SFT warm-start: whole multi-turn episodes played by a solver through the same
``Episode`` the rollout loop uses, so prompts, chat layout, forced prefix, parsing and loss mask are exactly those
of RL. Each turn's response is a short templated think and the solver's actions in the answer format.

Solvers per env type: Sokoban, the BFS-optimal plan cut into turns of ``max_actions_per_turn`` (instances whose
plan does not fit the action budget or the turns are skipped); FrozenLake, the success-maximising turn plan under
the slip rule (ragen.envs.frozen_lake_planner); Bandit, an arm drawn uniformly at random, so the warm-start teaches
the format and never which arm pays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ragen.agent.chat import ChatRenderer
from ragen.agent.episode import Episode, Trajectory
from ragen.agent.parsing import format_answer
from ragen.agent.prompts import forced_prefix
from ragen.config import AgentConfig, Config
from ragen.envs.frozen_lake import FrozenLakeEnv
from ragen.envs.frozen_lake_planner import FrozenLakePlanner
from ragen.envs.maze import MazeEnv
from ragen.envs.registry import BUILTIN_TAGS, TagSpec, get_tag
from ragen.envs.sokoban import SokobanEnv
from ragen.envs.sokoban.room import TARGET
from ragen.envs.sokoban.solver import solve
from ragen.rollout.table import COLUMNS as ROLLOUT_COLUMNS
from ragen.rollout.table import rollouts_frame
from ragen.tables import read_table, write_table

SPLITS = {"train": 0, "test": 100_000}  # seed offsets of the splits (disjoint seed ranges)
DEMO_COLUMNS = [*ROLLOUT_COLUMNS, "split", "solver", "responses"]
_BANDIT_KEY = 7  # spawn key of the Bandit demo's arm choice (apart from the env's own streams)


class NoDemo(Exception):
    """This instance has no demonstration within the budget (e.g. a Sokoban plan longer than the actions)."""


def _rc(cell: int, width: int) -> str:
    r, c = divmod(cell, width)
    return f"row {r + 1}, column {c + 1}"


def _names(env: object, actions: Sequence[int]) -> list[str]:
    lookup = env.action_lookup  # type: ignore[attr-defined]
    return [lookup[a] for a in actions]


class SokobanSolver:
    name = "bfs"
    expects_success = True

    def __init__(self, env: SokobanEnv, agent: AgentConfig, budget: int, seed: int = 0) -> None:
        plan = solve(env.current_room())
        if plan is None:
            raise NoDemo("no solution found")
        if len(plan) > budget or math.ceil(len(plan) / agent.max_actions_per_turn) > agent.max_turn:
            raise NoDemo(f"the optimal plan takes {len(plan)} actions, more than the budget allows")
        self.env, self.plan, self.k = env, list(plan), agent.max_actions_per_turn

    def turn(self, turns_left: int, actions_left: int) -> tuple[list[int], str]:
        acts, self.plan = self.plan[:self.k], self.plan[self.k:]
        room = self.env.current_room()
        w = room.width
        boxes = [b for b in room.boxes if room.fixed[b] != TARGET] or list(room.boxes)
        targets = [t for t in room.targets if t not in room.boxes] or list(room.targets)
        names = _names(self.env, acts)
        think = (f"I am at {_rc(room.player, w)}. The box is at {'; '.join(_rc(b, w) for b in boxes)} and the "
                 f"target is at {'; '.join(_rc(t, w) for t in targets)}. So I move {', '.join(names)}.")
        return acts, think


class FrozenLakeSolver:
    name = "value-iteration"
    expects_success = True

    def __init__(self, env: FrozenLakeEnv, agent: AgentConfig, budget: int, seed: int = 0) -> None:
        self.env = env
        self.planner = FrozenLakePlanner(env.desc, agent.max_actions_per_turn, env.is_slippery)
        self.goal = "".join(env.desc).index("G")

    def turn(self, turns_left: int, actions_left: int) -> tuple[list[int], str]:
        r, c = self.env.position
        acts = list(self.planner.plan(r * self.env.size + c, turns_left, actions_left))
        names = _names(self.env, acts)
        think = (f"I am at {_rc(r * self.env.size + c, self.env.size)} and the goal is at "
                 f"{_rc(self.goal, self.env.size)}. The ice is slippery, so I keep away from the holes: "
                 f"{', '.join(names)}.")
        return acts, think


class MazeSolver:
    name = "bfs"
    expects_success = True

    def __init__(self, env: MazeEnv, agent: AgentConfig, budget: int, seed: int = 0) -> None:
        plan = env.plan()
        if plan is None:
            raise NoDemo("the goal is walled off")
        if len(plan) > budget or math.ceil(len(plan) / agent.max_actions_per_turn) > agent.max_turn:
            raise NoDemo(f"the shortest path takes {len(plan)} moves, more than the budget allows")
        self.env, self.plan, self.k = env, plan, agent.max_actions_per_turn

    def turn(self, turns_left: int, actions_left: int) -> tuple[list[int], str]:
        acts, self.plan = self.plan[:self.k], self.plan[self.k:]
        (r, c), (gr, gc) = self.env.player, self.env.goal
        think = (f"I am at row {r + 1}, column {c + 1} and the goal is at row {gr + 1}, column {gc + 1}. Around the "
                 f"walls, the shortest way is {', '.join(_names(self.env, acts))}.")
        return acts, think


class BanditSolver:
    name = "uniform-random"
    expects_success = False  # success is the high arm: keeping only successes would leak the answer

    def __init__(self, env: object, agent: AgentConfig, budget: int, seed: int = 0) -> None:
        self.env = env
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_BANDIT_KEY,)))

    def turn(self, turns_left: int, actions_left: int) -> tuple[list[int], str]:
        lookup = self.env.action_lookup  # type: ignore[attr-defined]
        arm = int(self.rng.choice(sorted(lookup)))
        first, second = (lookup[i] for i in sorted(lookup))
        return [arm], f"I do not know yet how {first} and {second} pay out, so I try {lookup[arm]}."


# the demonstration solver of each env type (ragen.envs.registry.ENV_TYPES); each takes (env, agent, budget, seed)
SOLVERS: dict[str, type[SokobanSolver] | type[FrozenLakeSolver] | type[MazeSolver] | type[BanditSolver]] = {
    "sokoban": SokobanSolver, "frozen_lake": FrozenLakeSolver, "maze": MazeSolver, "bandit": BanditSolver}


def solver_for(spec: TagSpec, env: object, agent: AgentConfig, seed: int) -> SokobanSolver | FrozenLakeSolver | \
        MazeSolver | BanditSolver:
    if spec.env_type not in SOLVERS:
        raise ValueError(f"no demonstration solver for env type {spec.env_type!r} (tag {spec.tag}): add one to "
                         f"ragen/sft/demos.py SOLVERS, or leave the tag out of sft.tags")
    return SOLVERS[spec.env_type](env, agent, spec.max_actions_per_traj, seed)  # type: ignore[arg-type]


@dataclass
class Demo:
    trajectory: Trajectory
    responses: list[str]  # each turn's full response text (forced prefix included)
    solver: str


def play_demo(spec: TagSpec, agent: AgentConfig, renderer: ChatRenderer, seed: int) -> Demo:
    """One solver episode on instance ``seed``; raises NoDemo when the solver has no plan within the budget."""
    ep = Episode(spec.make(), spec, agent, renderer, seed=seed)
    solver = solver_for(spec, ep.env, agent, seed)
    prefix = forced_prefix(agent.enable_think)
    responses = []
    while not ep.done:
        turns_left = agent.max_turn - (len(ep.history) - 1)
        actions, think = solver.turn(turns_left, ep.history[-1].actions_left)
        text = format_answer(_names(ep.env, actions), think if agent.enable_think else None, agent.action_sep)
        assert text.startswith(prefix)
        ids = renderer.encode(text[len(prefix):]) + [renderer.end_of_turn_id]
        ep.record(ids, None, finish_reason="stop")
        responses.append(text)
    return Demo(ep.assemble(), responses, solver.name)


def demo_agent(cfg: Config) -> AgentConfig:
    """The agent settings of the demos: the run's, with the SFT section's think, turns and actions per turn."""
    s = cfg.sft
    return cfg.agent.model_copy(update={"enable_think": s.enable_think, "max_turn": s.max_turn,
                                        "max_actions_per_turn": s.max_actions_per_turn})


def demo_custom(cfg: Config) -> dict:
    """The ``envs.custom`` entries the demos (and the format evaluation) see: the tags it defines, not its changes
    to built-in tags. Those are RL settings, as the agent's are (``demo_agent``), so one warm-start serves every run
    that varies them (the granularity ablation's action budgets); to make demos on a changed env, define a new tag
    (``base: ...``) and list it in ``sft.tags``."""
    return {k: v for k, v in cfg.envs.custom.items() if k not in BUILTIN_TAGS}


def sft_config(cfg: Config) -> Config:
    """The run's config as the SFT stages see it: the demo agent settings and ``demo_custom``'s tags."""
    custom = demo_custom(cfg)
    if custom == dict(cfg.envs.custom):
        return cfg.model_copy(update={"agent": demo_agent(cfg)})
    data = cfg.model_dump(mode="json")
    data["envs"]["custom"], data["agent"] = custom, demo_agent(cfg).model_dump(mode="json")
    return Config.model_validate(data)


def make_demos(cfg: Config, renderer: ChatRenderer, *, splits: Sequence[str] = ("train", "test"),
               progress: Callable[[str, int, int], None] | None = None) -> pd.DataFrame:
    """``sft.n_train`` / ``sft.n_test`` demos per tag from consecutive seeds of each split, skipping instances
    without a plan (and FrozenLake episodes that slipped into a hole unless ``sft.keep_failed``)."""
    s, agent, specs = cfg.sft, demo_agent(cfg), sft_config(cfg).tag_specs()
    frames = []
    for split in splits:
        want = s.n_train if split == "train" else s.n_test
        if want == 0:
            continue
        for tag in s.tags:
            spec = get_tag(tag, specs)
            keys, trajs, extra = [], [], []
            seed, tried = s.seed + SPLITS[split], 0
            while len(trajs) < want:
                if tried >= 50 * want:
                    raise RuntimeError(f"sft: only {len(trajs)} of {want} {tag} demos after {tried} seeds; the "
                                       f"budget (max_actions_per_traj, sft.max_turn) is too small for this tag")
                tried += 1
                seed += 1
                try:
                    demo = play_demo(spec, agent, renderer, seed)
                except NoDemo:
                    continue
                t = demo.trajectory
                if len(t.input_ids) > cfg.rollout.max_model_len:
                    continue
                if SOLVERS[spec.env_type].expects_success and not t.success and not (
                        s.keep_failed and spec.env_type == "frozen_lake"):
                    continue
                n = len(trajs)
                keys.append({"iteration": 0, "mode": split, "env_id": n, "tag": tag, "group": n, "member": 0,
                             "seed": seed})
                trajs.append(t)
                extra.append({"split": split, "solver": demo.solver, "responses": demo.responses})
                if progress is not None:
                    progress(f"{split} {tag}", len(trajs), want)
            df = rollouts_frame(pd.DataFrame(keys), trajs)
            frames.append(pd.concat([df, pd.DataFrame(extra)], axis=1))
    out = pd.concat(frames, ignore_index=True)
    out["group"] = np.arange(len(out))  # every demo its own group (the trainer's batches index by group)
    return out


def write_demos(df: pd.DataFrame, path: str | Path) -> Path:
    return write_table(df, path)


def read_demos(path: str | Path) -> pd.DataFrame:
    return read_table(path, "demonstrations", DEMO_COLUMNS, "make them again with `ragen sft demos`")
