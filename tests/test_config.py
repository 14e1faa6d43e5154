from pathlib import Path

import pytest
import yaml

from ragen.config import (
    PARAMS_COMMAND,
    PARAMS_HEADER,
    PARAMS_PRESETS,
    Config,
    ConfigError,
    available_presets,
    commented_yaml,
    config_to_dict,
    flatten,
    load_config,
    load_config_with_origins,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_starpo_s_at_paper_scale():
    cfg = load_config()
    assert cfg.model.base == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (cfg.envs.train.env_groups, cfg.envs.train.group_size) == (8, 16)
    assert (cfg.envs.val.env_groups, cfg.envs.val.group_size, cfg.envs.val_seed) == (256, 1, 123)
    assert cfg.algorithm.filter_ratio == 0.25 and cfg.algorithm.adv_estimator == "gae"
    assert (cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high, cfg.actor.clip_ratio_c) == (0.2, 0.28, 3.0)
    assert (cfg.actor.lr, cfg.critic.lr, cfg.actor.entropy_coeff) == (1e-6, 1e-5, 0.001)
    assert cfg.agent.max_turn == 5 and cfg.agent.max_actions_per_turn == 5 and cfg.agent.format_penalty == -0.1
    assert (cfg.rollout.temperature, cfg.rollout.response_length, cfg.rollout.max_model_len) == (1.0, 400, 3600)
    assert cfg.trainer.total_training_steps == 200 and cfg.trainer.test_freq == 10


def test_presets():
    assert {"starpo", "starpo-s", "cpu-small", "paper"} <= set(available_presets())
    vanilla = load_config(presets=["starpo"])
    assert vanilla.algorithm.filter_ratio == 1.0 and vanilla.actor.clip_ratio_high == 0.2
    assert vanilla.algorithm.use_kl_in_reward and vanilla.algorithm.kl_coef == 0.001
    assert load_config(presets=["starpo-s"]).model_dump(exclude={"preset"}) == \
        load_config().model_dump(exclude={"preset"})
    small = load_config(presets=["cpu-small", "starpo"])
    assert small.model.base == "smollm2-135m-instruct" and small.algorithm.filter_ratio == 1.0
    assert small.preset == ["cpu-small", "starpo"]
    assert load_config(presets=["cpu-small,starpo"]).preset == ["cpu-small", "starpo"]
    assert load_config(presets=["paper"]).model.base == "Qwen/Qwen2.5-0.5B-Instruct"



def test_a_files_own_presets_go_under_its_values(tmp_path):
    # params.yaml names cpu-small (8 per group); a key edited in the file must win over that preset, and a
    # run's config.yaml must load as it ran, whatever its presets say today
    f = tmp_path / "p.yaml"
    f.write_text("preset: [cpu-small]\nenvs:\n  train:\n    group_size: 16\n")
    cfg = load_config(f)
    assert cfg.envs.train.group_size == 16 and cfg.envs.train.n_groups == [8] and cfg.preset == ["cpu-small"]
    on_top = load_config(f, ["cpu-frozenlake"])  # the presets argument still goes on top of the file
    assert on_top.envs.train.group_size == 4 and on_top.preset == ["cpu-small", "cpu-frozenlake"]
    assert load_config(f, (), ["envs.train.group_size=5"]).envs.train.group_size == 5

def test_ppo_and_grpo_presets_match_reference_3_9():
    s_grpo = load_config(presets=["starpo-s", "grpo"])
    assert s_grpo.algorithm.adv_estimator == "grpo" and s_grpo.algorithm.reward_norm_method == "mean_std"
    assert s_grpo.algorithm.filter_ratio == 0.25 and not s_grpo.actor.use_kl_loss
    assert s_grpo.actor.clip_ratio_high == 0.28
    v_grpo = load_config(presets=["starpo-grpo"])
    assert v_grpo.algorithm.filter_ratio == 1.0 and v_grpo.actor.clip_ratio_high == 0.2
    assert v_grpo.actor.use_kl_loss and v_grpo.actor.kl_loss_coef == 0.001 and v_grpo.actor.kl_loss_type == "kl"
    assert not v_grpo.algorithm.use_kl_in_reward
    v_ppo = load_config(presets=["starpo", "ppo"])
    assert v_ppo.algorithm.adv_estimator == "gae" and v_ppo.algorithm.use_kl_in_reward


def test_overrides_are_yaml_typed():
    cfg = load_config(presets=["cpu-small"], overrides=["agent.max_turn=3", "agent.enable_think=false",
                                                        "envs.train.tags=[Bandit]", "envs.train.n_groups=[8]",
                                                        "actor.betas=[0.9, 0.95]"])
    assert cfg.agent.max_turn == 3 and cfg.agent.enable_think is False
    assert cfg.envs.train.tags == ["Bandit"] and cfg.actor.betas == (0.9, 0.95)


@pytest.mark.parametrize("override,expected", [
    ("agent.max_turns=3", "unknown key 'agent.max_turns' (did you mean 'agent.max_turn'?)"),
    ("agnet.max_turn=3", "unknown key 'agnet'"),
    ("agent.max_turn=abc", "agent.max_turn = 'abc': Input should be a valid integer"),
    ("agent.max_turn=0", "agent.max_turn = 0: Input should be greater than or equal to 1"),
    ("algorithm.filter_type=top",
     "algorithm.filter_type = 'top': Input should be 'std', 'std_rev', 'max_mean' or 'top_p'"),
    ("agent.response_storage=cleaned", "Input should be 'sampled' or 'rebuilt'"),
    ("envs.train.tags=[Sokoban]", "unknown tag 'Sokoban'"),
    ("actor.micro_batch_size=3", "actor.micro_batch_size (3) must divide actor.ppo_mini_batch_size (32)"),
    ("agent.max_context_window=0", "max_context_window must be -1 or >= 1"),
    ("noequals", "must look like key.sub=value"),
])
def test_error_messages_name_key_value_and_allowed(override, expected):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[override])
    assert expected in str(e.value)


def test_contradictory_filter_is_rejected():
    with pytest.raises(ConfigError, match=r"keeps 16 of 128 trajectories .* fewer than actor.ppo_mini_batch_size=32"):
        load_config(overrides=["algorithm.filter_ratio=0.125"])
    with pytest.raises(ConfigError, match="tags has 2 entries but n_groups has 1"):
        load_config(overrides=["envs.train.tags=[Bandit, SimpleSokoban]"])


def test_unknown_preset_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown preset 'starpos' \(did you mean 'starpo"):
        load_config(presets=["starpos"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("agent:\n  enable_thnk: true\n")
    expected = rf"{typo}: unknown key 'agent.enable_thnk' \(did you mean 'agent.enable_think'"
    with pytest.raises(ConfigError, match=expected):
        load_config(typo)


def test_custom_tags_in_config():
    cfg = load_config(overrides=["envs.custom={BanditPaper: {base: Bandit, env_kwargs: {lo_arm_score: 0.15}}}",
                                 "envs.train.tags=[BanditPaper]"])
    assert cfg.tag_specs()["BanditPaper"].env_kwargs["lo_arm_score"] == 0.15
    with pytest.raises(ConfigError, match=r"envs\.custom\.Nope"):
        load_config(overrides=["envs.custom={Nope: {}}"])


def test_params_yaml_is_the_generated_main_config():
    """params.yaml documents every key and must not drift from the schema."""
    path = ROOT / "params.yaml"
    from ragen.experiments import grid_yaml

    main = load_config(presets=list(PARAMS_PRESETS))
    assert path.read_text() == commented_yaml(main, PARAMS_HEADER) + grid_yaml(), \
        f"params.yaml is stale: regenerate with `{PARAMS_COMMAND}`"
    assert load_config(path) == main


def test_flatten_for_tracking():
    flat = flatten(Config().model_dump(mode="json"))
    assert flat["agent.max_turn"] == 5 and flat["envs.train.group_size"] == 16


def test_envs_for_mode():
    cfg = load_config(presets=["cpu-small"])
    assert cfg.envs.for_mode("train") == (cfg.envs.train, 10000)
    assert cfg.envs.for_mode("val") == (cfg.envs.val, 123)
    with pytest.raises(ValueError, match="mode must be"):
        cfg.envs.for_mode("test")


def test_a_run_config_with_removed_keys_still_loads(tmp_path):
    """A run's config.yaml written before algorithm.kl_ctrl/kl_target/kl_horizon were removed loads as a params
    file (re-scoring or logging an old run); an override naming one is still an unknown key."""
    old = config_to_dict(load_config(None, ["cpu-small"]))
    old["algorithm"].update({"kl_ctrl": "fixed", "kl_target": 0.1, "kl_horizon": 10000})
    p = tmp_path / "config.yaml"
    p.write_text(yaml.safe_dump(old))
    assert load_config(p).algorithm.kl_coef == 0.0
    with pytest.raises(ConfigError, match="kl_ctrl"):
        load_config(None, [], ["algorithm.kl_ctrl=adaptive"])


@pytest.mark.unit
def test_a_matrix_item_names_one_grid_run():
    from ragen.experiments import Grid

    g = Grid(seeds=(0, 1), run=("granularity-1", "granularity-5"))
    assert g.run_of_item("granularity-1-0") == ("granularity-1", 0)
    assert g.run_of_item("granularity-5-1") == ("granularity-5", 1)
    with pytest.raises(KeyError, match="granularity-5-0"):
        g.run_of_item("granularity-5-2")


def test_each_value_says_which_layer_set_it(tmp_path):
    """``config show --origin``: the last layer that set a key (default < the file's own presets < the file <
    the presets asked for < overrides)."""
    params = tmp_path / "p.yaml"
    params.write_text("preset: [cpu-small]\ntrainer: {seed: 7}\n")
    cfg, origin = load_config_with_origins(params, ["cpu-sokoban"], ["critic.lr=1e-4", "envs.val.n_groups=[2]"])
    assert origin["trainer.run_dir"] == "default"
    assert origin["agent.max_turn"] == "preset cpu-sokoban"  # set by cpu-small (via the file), then cpu-sokoban
    assert origin["rollout.engine"] == f"preset cpu-small via {params}"
    assert origin["trainer.seed"] == str(params) and cfg.trainer.seed == 7
    assert origin["actor.lr"] == "preset cpu-sokoban"  # the presets asked for go on top of the file
    assert origin["critic.lr"] == "override" and origin["envs.val.n_groups"] == "override"
    assert set(origin) == set(flatten(config_to_dict(cfg)))
    assert load_config_with_origins()[1]["actor.lr"] == "default"
