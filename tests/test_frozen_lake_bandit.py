import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen.envs import get_tag
from ragen.envs.bandit import BanditEnv
from ragen.envs.frozen_lake import FrozenLakeEnv, random_map, shortest_path_length

pytestmark = pytest.mark.unit

LEFT, DOWN, RIGHT, UP = 1, 2, 3, 4
OPEN = ["FFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFG"]


def lake(desc, seed=0, member=None):
    env = FrozenLakeEnv(size=len(desc))
    env.reset(seed=seed, options={"desc": desc, "member": member})
    return env


def test_slip_is_one_third_each_over_seeded_draws():
    counts = collections.Counter()
    n = 3000
    for seed in range(n):
        env = lake(OPEN, seed=seed)
        env.step(DOWN)  # from (2, 2): Down intended, Left or Right perpendicular
        counts[env.position] += 1
    assert set(counts) == {(3, 2), (2, 1), (2, 3)}
    for pos in counts:
        assert abs(counts[pos] / n - 1 / 3) < 0.03, counts


def test_no_slip_when_not_slippery_and_walls_keep_position():
    env = FrozenLakeEnv(size=5, is_slippery=False)
    env.reset(seed=0, options={"desc": ["SFFFF", "FFFFF", "FFFFF", "FFFFF", "FFFFG"]})
    _, r, _term, _trunc, info = env.step(UP)  # off the grid: stays in place
    assert env.position == (0, 0) and not info["action_is_effective"] and r == 0.0
    env.step(RIGHT)
    assert env.position == (0, 1)


def test_hole_and_goal_terminate_with_symbols():
    env = FrozenLakeEnv(size=2, is_slippery=False)
    env.reset(seed=0, options={"desc": ["SH", "GF"]})
    assert env.render_text() == "PO\nG_"
    _, r, term, _, info = env.step(RIGHT)
    assert term and r == 0.0 and not info["success"]
    assert env.render_text() == "_X\nG_"
    env.reset(seed=0, options={"desc": ["SH", "GF"]})
    _, r, term, _, info = env.step(DOWN)
    assert term and r == 1.0 and info["success"]
    assert env.render_text() == "_O\n√_"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**31))
def test_random_map_always_has_a_path(seed):
    desc = random_map(4, 0.8, np.random.default_rng(seed))
    flat = "".join(desc)
    assert flat.count("S") == 1 and flat.count("G") == 1
    assert set(flat) <= set("SFHG")
    assert shortest_path_length(desc) is not None


def test_frozen_lake_map_is_a_function_of_the_seed():
    env = get_tag("FrozenLake").make()
    a = env.reset(seed=11)[0]
    assert env.reset(seed=11)[0] == a
    maps = {env.reset(seed=s)[0] for s in range(50)}
    assert len(maps) > 40


def test_shared_stream_gives_identical_slips_independent_does_not():
    def run(member):
        env = get_tag("FrozenLake").make()
        env.reset(seed=500, options={"member": member})
        return [env.step(a)[0] for a in (DOWN, RIGHT, UP, LEFT, DOWN) if True]

    shared = [run(None) for _ in range(4)]
    assert all(s == shared[0] for s in shared)
    independent = {tuple(run(m)) for m in range(8)}
    assert len(independent) > 1


def test_bandit_arm_order_is_shuffled_per_seed():
    env = BanditEnv()
    orders = collections.Counter(tuple(env.reset(seed=s) and env.action_lookup.values()) for s in range(400))
    assert set(orders) == {("Phoenix", "Dragon"), ("Dragon", "Phoenix")}
    assert 0.4 < orders[("Phoenix", "Dragon")] / 400 < 0.6
    env.reset(seed=9)
    first = env.action_lookup
    env.reset(seed=9, options={"member": 3})
    assert env.action_lookup == first  # the order is part of the initial state, shared by the group


def test_bandit_rewards_and_success():
    env = BanditEnv()
    lo_rewards, hi_rewards = [], []
    for s in range(2000):
        obs, _ = env.reset(seed=s)
        assert "Phoenix" in obs and "Dragon" in obs and "<answer>" in obs
        ids = {v: k for k, v in env.action_lookup.items()}
        arm = "Phoenix" if s % 2 else "Dragon"
        obs, r, term, trunc, info = env.step(ids[arm])
        assert term and not trunc
        assert obs == f"{arm}: {r} points"
        assert info["success"] == (arm == "Dragon")
        (lo_rewards if arm == "Phoenix" else hi_rewards).append(r)
    assert set(lo_rewards) == {0.1}
    assert set(hi_rewards) == {0.0, 1.0}
    assert abs(np.mean(hi_rewards) - 0.25) < 0.04


def test_bandit_names_and_low_score_are_configurable():
    spec = get_tag("BanditTest")
    env = spec.make()
    obs, _ = env.reset(seed=0)
    assert "Trader" in obs and "Librarian" in obs and env.hi_arm_name == "Librarian"
    env = spec.make(lo_arm_score=0.15)
    env.reset(seed=0)
    lo_id = next(i for i, n in env.action_lookup.items() if n == "Trader")
    assert env.step(lo_id)[1] == 0.15
    with pytest.raises(ValueError, match="must differ"):
        BanditEnv(lo_arm_name="A", hi_arm_name="a")


def test_shared_group_stream_gives_same_payout():
    payouts = set()
    for _ in range(5):
        env = BanditEnv()
        env.reset(seed=77)
        payouts.add(env.step(env.hi_arm_id)[1])
    assert len(payouts) == 1
    many = set()
    for m in range(32):
        env = BanditEnv()
        env.reset(seed=77, options={"member": m})
        many.add(env.step(env.hi_arm_id)[1])
    assert many == {0.0, 1.0}



def test_no_slip_tag_moves_where_it_says_and_says_so():
    """FrozenLakeNoSlip: the original's is_slippery=False on the FrozenLake maps; its prompt drops the slippery
    sentence. Over seeds and random moves, every move from a frozen cell lands where it points (or stays at an
    edge), where the slippery tag sends a third of them sideways."""
    spec = get_tag("FrozenLakeNoSlip")
    assert "slippery" not in spec.instruction and "slippery" in get_tag("FrozenLake").instruction
    step = {LEFT: (0, -1), DOWN: (1, 0), RIGHT: (0, 1), UP: (-1, 0)}
    rng = np.random.default_rng(0)
    off = {}
    for name in ("FrozenLakeNoSlip", "FrozenLake"):
        env, moves, astray = get_tag(name).make(), 0, 0
        for seed in range(40):
            env.reset(seed=seed)
            for _ in range(6):
                a = int(rng.integers(1, 5))
                (r, c), (dr, dc) = env.position, step[a]
                want = (min(max(r + dr, 0), env.size - 1), min(max(c + dc, 0), env.size - 1))
                _, _, term, _, _ = env.step(a)
                moves, astray = moves + 1, astray + (env.position != want)
                if term:
                    break
        off[name] = astray / moves
    assert get_tag("FrozenLakeNoSlip").make().reset(seed=7)[0] == get_tag("FrozenLake").make().reset(seed=7)[0]
    assert off["FrozenLakeNoSlip"] == 0 and off["FrozenLake"] > 0.2, off
