"""The Maze env (added by following docs/extending.md): moves and walls by hand, the shortest path, seeded
layouts as properties, and its demonstration solver reaching the goal."""

from __future__ import annotations

import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen.config import AgentConfig
from ragen.envs import BUILTIN_TAGS
from ragen.envs.maze import MazeEnv, shortest_path
from ragen.sft.demos import SOLVERS, NoDemo, solver_for

pytestmark = pytest.mark.unit

UP, DOWN, LEFT, RIGHT = 1, 2, 3, 4
LAYOUT = ["S.#",
          ".##",
          "..G"]


def maze(layout=LAYOUT, **kw) -> MazeEnv:
    env = MazeEnv(size=len(layout), min_distance=1, **kw)
    env.reset(seed=0, options={"layout": layout})
    return env


def test_moves_walls_and_the_goal_by_hand():
    env = maze()
    assert env.render_text() == "P.#\n.##\n..G"
    obs, r, term, trunc, info = env.step(UP)  # off the grid: stays
    assert (r, term, info["action_is_effective"]) == (0.0, False, False)
    _, _, _, _, info = env.step(RIGHT)
    assert env.player == (0, 1) and info["action_is_effective"]
    _, _, _, _, info = env.step(RIGHT)  # a wall: stays
    assert env.player == (0, 1) and not info["action_is_effective"]
    for a in (LEFT, DOWN, DOWN, RIGHT):
        obs, r, term, trunc, info = env.step(a)
    assert (r, term, trunc, info["success"]) == (0.0, False, False, False) and obs == "..#\n.##\n.PG"
    obs, r, term, trunc, info = env.step(RIGHT)
    assert (obs, r, term, info["success"]) == ("..#\n.##\n..√", 1.0, True, True)


def test_shortest_path_and_optimal_length():
    assert shortest_path(LAYOUT) == [DOWN, DOWN, RIGHT, RIGHT]
    assert shortest_path(["S#", "#G"]) is None
    env = maze()
    assert env.optimal_length() == 4
    env.step(DOWN)
    assert env.plan() == [DOWN, RIGHT, RIGHT]


def test_truncated_after_max_steps():
    env = maze(max_steps=2)
    assert env.step(UP)[3] is False and env.step(UP)[3] is True


def test_bad_settings_and_layouts_are_refused():
    with pytest.raises(ValueError, match="p_open"):
        MazeEnv(p_open=0.05)
    with pytest.raises(ValueError, match="min_distance"):
        MazeEnv(size=3, min_distance=9)
    with pytest.raises(ValueError, match="one S and one G"):
        MazeEnv(size=2, min_distance=1).reset(seed=0, options={"layout": ["SS", ".G"]})


def test_the_tag_passes_gymnasiums_checker():
    check_env(BUILTIN_TAGS["Maze"].make(render_mode="ansi"))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), member=st.one_of(st.none(), st.integers(0, 7)))
def test_any_seed_gives_a_solvable_layout_fixed_by_the_seed(seed, member):
    env = BUILTIN_TAGS["Maze"].make()
    obs, _ = env.reset(seed=seed, options={"member": member})
    assert "".join(env.layout).count("S") == 1 and "".join(env.layout).count("G") == 1
    assert env.optimal_length() is not None and env.optimal_length() >= 3
    other = BUILTIN_TAGS["Maze"].make()
    assert other.reset(seed=seed)[0] == obs  # members share the layout: nothing else is random


@pytest.mark.parametrize("seed", range(20))
def test_the_solver_walks_to_the_goal_in_turns(seed):
    spec, agent = BUILTIN_TAGS["Maze"], AgentConfig(max_turn=5, max_actions_per_turn=5)
    env = spec.make()
    env.reset(seed=seed)
    best = env.optimal_length()
    try:
        solver = solver_for(spec, env, agent, seed)
    except NoDemo:
        assert best > spec.max_actions_per_traj
        return
    assert isinstance(solver, SOLVERS["maze"])
    for turn in range(agent.max_turn):
        acts, think = solver.turn(agent.max_turn - turn, spec.max_actions_per_traj)
        assert 1 <= len(acts) <= agent.max_actions_per_turn and "the goal is at" in think
        for a in acts:
            *_, info = env.step(a)
        if info["success"]:
            break
    assert info["success"] and env.num_env_steps == best  # the shortest way, not just a way
