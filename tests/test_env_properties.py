"""Property tests: random seeds and random action sequences keep every env inside its contract."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen.envs import get_tag
from ragen.envs.sokoban import optimal_length

pytestmark = pytest.mark.unit

SOKOBAN_REWARDS = {-0.1, 0.9, -1.1, 10.9}


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["SimpleSokoban", "LargerSokoban", "SokobanDifferentGridVocab"]),
       st.integers(0, 2**32 - 1), st.lists(st.integers(1, 4), max_size=30))
def test_sokoban_random_play(tag, seed, actions):
    env = get_tag(tag).make()
    obs, _ = env.reset(seed=seed)
    n_boxes = len(env.current_room().boxes)
    assert obs in env.observation_space and optimal_length(env.current_room()) is not None
    for a in actions:
        before = env.current_room()
        obs, reward, terminated, truncated, info = env.step(a)
        room = env.current_room()
        assert obs in env.observation_space and obs == env.render_text()
        assert len(set(room.boxes)) == n_boxes and room.player not in room.boxes
        assert round(reward, 6) in SOKOBAN_REWARDS
        assert info["action_is_effective"] == (room.player != before.player)
        assert terminated == (room.boxes_on_target == n_boxes) == info["success"]
        if terminated or truncated:
            break


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 15), st.lists(st.integers(1, 4), max_size=20))
def test_frozen_lake_random_play(seed, member, actions):
    env = get_tag("FrozenLake").make()
    obs, _ = env.reset(seed=seed, options={"member": member})
    assert obs.count("P") == 1 and obs.count("G") == 1
    for a in actions:
        obs, reward, terminated, _, info = env.step(a)
        assert obs in env.observation_space
        assert reward == (1.0 if info["success"] else 0.0)
        assert terminated == (env.desc[env.position[0]][env.position[1]] in "HG")
        if terminated:
            assert ("X" in obs) != ("√" in obs)
            break


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["Bandit", "BanditTest", "BanditGeneralization"]), st.integers(0, 2**32 - 1),
       st.integers(1, 2))
def test_bandit_random_play(tag, seed, action):
    env = get_tag(tag).make()
    obs, _ = env.reset(seed=seed)
    assert obs in env.observation_space
    name = env.action_lookup[action]
    obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and not truncated and obs.startswith(f"{name}: ")
    assert reward == 0.1 if name == env.lo_arm_name else reward in (0.0, 1.0)
    assert info["success"] == (name == env.hi_arm_name)
