import pandas as pd
import pytest

from ragen.envs.instances import (
    COLUMNS,
    generate_instances,
    group_tags,
    plan_instances,
    read_instances,
    write_instances,
)
from ragen.envs.seeding import dynamics_seed, group_base_seed, layout_rng, member_stream

pytestmark = pytest.mark.unit


def test_group_base_seed_follows_head_schedule():
    assert group_base_seed("train", 0, 8, 10000) == 10000
    assert group_base_seed("train", 3, 8, 10000) == 10024  # step k uses 10000+8k ... 10000+8k+7
    assert group_base_seed("val", 0, 256, 123) == group_base_seed("val", 50, 256, 123) == 123
    with pytest.raises(ValueError):
        group_base_seed("test", 0, 8, 1)


def test_plan_members_share_seed_and_ids_are_global():
    plan = plan_instances(["SimpleSokoban"], [8], 16, 10000)
    assert len(plan) == 128
    assert [p.env_id for p in plan] == list(range(128))
    assert all(p.group == p.env_id // 16 and p.member == p.env_id % 16 for p in plan)
    assert all(p.seed == 10000 + p.group for p in plan)
    assert [p.stream for p in plan[:3]] == [0, 1, 2]
    assert {p.stream for p in plan_instances(["Bandit"], [2], 4, 0, "shared")} == {None}


def test_multi_tag_layout_takes_consecutive_seeds():
    tags = ["SimpleSokoban", "LargerSokoban", "SokobanDifferentGridVocab", "FrozenLake"]
    plan = plan_instances(tags, [128] * 4, 1, 123)
    ranges = {t: (min(p.seed for p in plan if p.tag == t), max(p.seed for p in plan if p.tag == t)) for t in tags}
    assert ranges == {"SimpleSokoban": (123, 250), "LargerSokoban": (251, 378),
                      "SokobanDifferentGridVocab": (379, 506), "FrozenLake": (507, 634)}
    with pytest.raises(ValueError, match="same length"):
        group_tags(["A"], [1, 2])


def test_streams_are_distinct_and_independent_of_hashing():
    assert dynamics_seed(5, None) != dynamics_seed(5, 0) != dynamics_seed(5, 1)
    assert dynamics_seed(5, 0) == dynamics_seed(5, 0)
    assert layout_rng(5).random() == layout_rng(5).random()
    assert member_stream(3, "independent") == 3 and member_stream(3, "shared") is None


def test_generate_instances_table(tmp_path):
    df = generate_instances(["SimpleSokoban", "FrozenLake", "Bandit"], [2, 1, 1], 3, seed=10000, iteration=2)
    assert list(df.columns) == COLUMNS
    assert len(df) == 12
    assert (df["iteration"] == 2).all() and (df["mode"] == "train").all()
    assert sorted(df["seed"].unique()) == [10008, 10009, 10010, 10011]
    assert df.groupby("group")["initial_state"].nunique().eq(1).all()  # members share the initial state
    sok = df[df.tag == "SimpleSokoban"]
    assert sok["optimal_length"].notna().all() and (sok["optimal_length"] >= 1).all()
    assert df[df.tag == "Bandit"]["optimal_length"].isna().all()
    path = write_instances(df, tmp_path / "iter_2" / "instances.parquet")
    back = read_instances(path)
    pd.testing.assert_frame_equal(back, df)
    again = generate_instances(["SimpleSokoban", "FrozenLake", "Bandit"], [2, 1, 1], 3, seed=10000, iteration=2)
    pd.testing.assert_frame_equal(again, df)  # a resumed run regenerates identical instances


def test_val_instances_ignore_iteration():
    a = generate_instances(["SimpleSokoban"], [4], 1, seed=123, iteration=0, mode="val")
    b = generate_instances(["SimpleSokoban"], [4], 1, seed=123, iteration=9, mode="val")
    assert a["initial_state"].tolist() == b["initial_state"].tolist()
    assert a["seed"].tolist() == [123, 124, 125, 126]


def test_read_instances_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_instances(tmp_path / "missing.parquet")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="not a readable parquet"):
        read_instances(bad)
    pd.DataFrame({"tag": ["x"]}).to_parquet(tmp_path / "short.parquet")
    with pytest.raises(ValueError, match="lacks columns"):
        read_instances(tmp_path / "short.parquet")
