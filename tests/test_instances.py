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


@pytest.mark.unit
def test_planned_train_seeds_and_the_panel_check_by_hand():
    """3 groups (2 of A, 1 of B) from seed 100, 2 iterations: A gets 100, 101, 103, 104 and B 102, 105; a seed
    cycle [7, 8] gives A 7, 8 and B 7, 8. A panel on trained seeds is refused unless the run trains on a fixed
    list (a positive control, which scores its own seeds on purpose)."""
    from ragen.config import load_config
    from ragen.envs.instances import planned_train_seeds
    from ragen.eval.panels import Panel
    from ragen.run.learn_bench import check_panel_unseen, panel_seeds_trained

    assert planned_train_seeds(["A", "B"], [2, 1], seed=100, iterations=2) == {"A": {100, 101, 103, 104},
                                                                               "B": {102, 105}}
    assert planned_train_seeds(["A", "B"], [2, 1], seed=100, iterations=2, seed_cycle=[7, 8]) == \
        {"A": {7, 8}, "B": {7, 8}}
    cfg = load_config(None, ["cpu-small"], ["envs.train_seed=10000", "envs.train.n_groups=[8]",
                                            "trainer.total_training_steps=10"])
    clear = Panel("p", {"Bandit": (123, 124)})
    hit = Panel("p", {"Bandit": (10005, 10079, 10080)})  # 8 groups x 10 iterations: 10000..10079
    assert panel_seeds_trained(cfg, clear) == {"Bandit": 0} and panel_seeds_trained(cfg, hit) == {"Bandit": 2}
    check_panel_unseen(cfg, clear)
    with pytest.raises(ValueError, match="Bandit 2 seed"):
        check_panel_unseen(cfg, hit)
    control = load_config(None, ["cpu-small"], ["envs.train_seeds=[10005]"])
    check_panel_unseen(control, hit)
