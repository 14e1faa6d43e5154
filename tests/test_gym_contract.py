import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import ragen.envs  # noqa: F401  (registers the ids)
from ragen.envs import BUILTIN_TAGS, resolve_tags

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("tag", sorted(BUILTIN_TAGS))
def test_every_tag_passes_check_env(tag):
    env = BUILTIN_TAGS[tag].make(render_mode="ansi")
    check_env(env)
    obs, _info = env.reset(seed=123)
    assert isinstance(obs, str) and obs in env.observation_space
    assert env.render() == obs


@pytest.mark.parametrize("env_id,kwargs", [
    ("ragen/Sokoban-v0", {"dim": (6, 6), "num_boxes": 1}),
    ("ragen/FrozenLake-v0", {"size": 4}),
    ("ragen/Bandit-v0", {"lo_arm_name": "Trader", "hi_arm_name": "Librarian"}),
])
def test_gymnasium_make(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    obs, _ = env.reset(seed=1)
    assert isinstance(obs, str)
    check_env(env.unwrapped)


def test_reset_rejects_bad_seed_and_member():
    env = BUILTIN_TAGS["SimpleSokoban"].make()
    with pytest.raises(ValueError, match="seed"):
        env.reset(seed=-1)
    with pytest.raises(ValueError, match="member"):
        env.reset(seed=1, options={"member": "x"})


def test_custom_tags():
    tags = resolve_tags({"Bandit": {"env_kwargs": {"lo_arm_score": 0.15}},
                         "MyBandit": {"base": "Bandit", "env_kwargs": {"lo_arm_name": "Cat", "hi_arm_name": "Lion"}}})
    assert tags["Bandit"].env_kwargs["lo_arm_score"] == 0.15
    assert tags["MyBandit"].env_kwargs["lo_arm_name"] == "Cat"
    assert tags["MyBandit"].env_kwargs["lo_arm_score"] == 0.15  # inherits the overridden base
    with pytest.raises(ValueError, match="give 'base'"):
        resolve_tags({"Nope": {}})
    with pytest.raises(ValueError, match="unknown field"):
        resolve_tags({"Bandit": {"colour": 1}})
    with pytest.raises(ValueError, match="env_kwargs"):
        resolve_tags({"Bandit": {"env_kwargs": {"bogus": 1}}})
