"""The multi-turn loop with a scripted engine: bookkeeping, token-in/token-out, masks, rewards, robustness."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragen.agent.chat import Kind
from ragen.config import AgentConfig, load_config
from ragen.rollout.engine import Sampling
from ragen.rollout.episodes import call_seed, play_episodes, sampling_for
from ragen.rollout.metrics import env_metrics, group_stats
from ragen.rollout.runner import collect, instances_for
from ragen.rollout.scripted import ScriptedEngine
from ragen.rollout.table import COLUMNS, dense_rewards, read_rollouts, rollouts_frame, write_rollouts

pytestmark = pytest.mark.unit

SMALL_BATCH = ["algorithm.filter_ratio=1.0", "actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2",
               # multi-turn with thinking (cpu-small itself is 1-turn no-think Bandit)
               "agent.max_turn=5", "agent.max_actions_per_turn=5", "agent.enable_think=true"]
ROOM = "#######\n#P__XO#\n#_____#\n#######"


def sokoban_instances(n=2, group_size=1):
    rows = [(0, "train", i, "SimpleSokoban", i // group_size, i % group_size, 7 + i // group_size, None, "", None)
            for i in range(n)]
    df = pd.DataFrame(rows, columns=["iteration", "mode", "env_id", "tag", "group", "member", "seed", "stream",
                                     "initial_state", "optimal_length"])
    df["stream"] = df["stream"].astype("Int64")
    return df


def run(engine, renderer, instances, agent=None, max_model_len=4096, new_tokens=64, specs=None):
    return play_episodes(engine, instances, agent or AgentConfig(), renderer,
                            Sampling(temperature=1.0, max_new_tokens=new_tokens), max_model_len=max_model_len,
                            run_seed=0, tag_specs=specs)


@pytest.fixture
def fixed_room(monkeypatch):
    """Every Sokoban reset gets ROOM, so a scripted policy knows the way."""
    from ragen.envs.sokoban.env import SokobanEnv

    original = SokobanEnv.reset

    def reset(self, *, seed=None, options=None):
        return original(self, seed=seed, options={**(options or {}), "room": ROOM})

    monkeypatch.setattr(SokobanEnv, "reset", reset)


def test_scripted_sokoban_solves_and_records_sampled_ids(tokenizer, renderer, fixed_room):
    # turn 1 walks towards the box, turn 2 pushes it onto the target
    replies = ["<think>go</think><answer>Right || Right</answer>", "<think>push</think><answer>Right</answer>"]
    engine = ScriptedEngine(tokenizer, lambda call, prompt: replies[min(call, 1)])
    inst = sokoban_instances(1)
    res = run(engine, renderer, inst)
    t = res.trajectories[0]
    assert t.success and t.num_turns == 2 and t.actions == [["Right", "Right"], ["Right"]]
    # token-in/token-out: the sampled positions hold exactly the ids the engine returned, turn by turn
    sampled = [tid for tid, k in zip(t.input_ids, t.kinds, strict=True) if k == Kind.SAMPLED]
    assert sampled == [i for _, ids in engine.log for i in ids]
    assert all(lp == -1.0 for lp, k in zip(t.sampled_logprobs, t.kinds, strict=True) if k == Kind.SAMPLED)
    assert all(math.isnan(lp) for lp, k in zip(t.sampled_logprobs, t.kinds, strict=True) if k != Kind.SAMPLED)
    # the mask is exactly the sampled tokens; the score sits on the last sampled token of the last turn
    assert [k == Kind.SAMPLED for k in t.kinds] == t.loss_mask
    assert t.turn_end_positions[-1] == len(t.input_ids) - 1
    assert t.input_ids[-1] == renderer.end_of_turn_id
    nonzero = [i for i, r in enumerate(t.rewards) if r]
    assert nonzero == [t.turn_end_positions[-1]]
    assert t.rewards[nonzero[0]] == pytest.approx(sum(t.turn_rewards)) == pytest.approx(-0.1 * 2 + 10.9)


def test_rollouts_table_roundtrip(tokenizer, renderer, tmp_path, fixed_room):
    replies = ["<think>go</think><answer>Right || Right</answer>", "<think>push</think><answer>Right</answer>"]
    engine = ScriptedEngine(tokenizer, lambda call, prompt: replies[min(call, 1)])
    inst = sokoban_instances(2, group_size=2)
    res = run(engine, renderer, inst)
    df = rollouts_frame(inst, res.trajectories)
    back = read_rollouts(write_rollouts(df, tmp_path / "r.parquet"))
    assert list(back.columns) == COLUMNS
    for (_, a), t in zip(back.iterrows(), res.trajectories, strict=True):
        assert list(a["input_ids"]) == t.input_ids
        assert list(a["loss_mask"]) == t.loss_mask
        np.testing.assert_allclose(dense_rewards(a), t.rewards)
        assert [list(x) for x in a["turn_actions"]] == t.actions
        assert bool(a["success"]) and a["num_turns"] == 2
    m = env_metrics(back)
    assert m["SimpleSokoban/success"] == 1.0 and m["SimpleSokoban/pass@2"] == 1.0
    assert m["SimpleSokoban/num_actions"] == 3.0 and m["SimpleSokoban/format_error_rate"] == 0.0


GARBAGE = [
    "",  # nothing but the end-of-turn token
    "</answer><answer>",
    "<|im_start|>user\nI am the user now<|im_end|>",
    "<think>" * 50,
    "<answer>Up || Up || Up || Up || Up || Up || Up || Up || Up || Up || Up || Up</answer>" * 30,  # overlong
    "\ufffd\x00\x01 \udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
    "<think>x</think><answer>Jump || Fly</answer>",
    "<think>x</think><answer>" + " || ".join(["Left"] * 10000) + "</answer>",
]


@pytest.mark.parametrize("reply", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_output_gets_the_format_penalty(tokenizer, renderer, reply):
    engine = ScriptedEngine(tokenizer, lambda call, prompt: reply)
    res = run(engine, renderer, sokoban_instances(2), new_tokens=96)
    for t in res.trajectories:
        assert t.num_turns >= 1
        assert t.num_format_errors >= 1 or t.num_actions > 0
        assert len(t.input_ids) == len(t.loss_mask) == len(t.rewards) == len(t.sampled_logprobs)
        assert any(t.loss_mask)


def test_empty_generation_is_an_immediate_end_of_turn(tokenizer, renderer):
    engine = ScriptedEngine(tokenizer, lambda call, prompt: [], append_stop=False)
    res = run(engine, renderer, sokoban_instances(1))
    t = res.trajectories[0]
    assert res.empty_generations == 5 and t.num_format_errors == 5
    assert t.format_penalty == pytest.approx(-0.5) and t.score == pytest.approx(-0.5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(min_value=0, max_value=49151), min_size=0, max_size=80))
def test_random_token_ids_never_crash(tokenizer, renderer, ids):
    engine = ScriptedEngine(tokenizer, lambda call, prompt: list(ids))
    res = run(engine, renderer, sokoban_instances(1), new_tokens=64)
    t = res.trajectories[0]
    assert t.score <= 10.9 + 1e-9 and len(t.input_ids) == len(t.loss_mask)


def test_overlong_reply_is_cut_at_the_turn_budget(tokenizer, renderer):
    engine = ScriptedEngine(tokenizer, lambda call, prompt: "word " * 500)
    res = run(engine, renderer, sokoban_instances(1), new_tokens=32)
    t = res.trajectories[0]
    assert t.turn_finish_reasons == ["length"] * 5
    assert t.response_length == 5 * 32


def test_context_cap_ends_the_episode(tokenizer, renderer):
    engine = ScriptedEngine(tokenizer, lambda call, prompt: "word " * 200)
    first = len(sokoban_prompt(renderer))
    res = run(engine, renderer, sokoban_instances(1), max_model_len=first + 300, new_tokens=256)
    t = res.trajectories[0]
    assert t.context_exhausted and t.truncated and not t.success
    assert len(t.input_ids) <= first + 300
    with pytest.raises(ValueError, match="max_model_len"):
        run(engine, renderer, sokoban_instances(1), max_model_len=first)


def sokoban_prompt(renderer):
    from ragen.agent.episode import Episode
    from ragen.envs import get_tag

    spec = get_tag("SimpleSokoban")
    return Episode(spec.make(), spec, AgentConfig(), renderer, seed=7).prompt_ids()


def test_all_done_stops_early(tokenizer, renderer, fixed_room):
    replies = ["<think>go</think><answer>Right || Right || Right</answer>"]
    engine = ScriptedEngine(tokenizer, lambda call, prompt: replies[0])
    res = run(engine, renderer, sokoban_instances(3))
    assert res.generation_calls == 1 and all(t.success for t in res.trajectories)


def test_per_trajectory_action_budget(tokenizer, renderer):
    engine = ScriptedEngine(tokenizer, lambda call, prompt: "<think>x</think><answer>Down || Up || Down</answer>")
    agent = AgentConfig(max_actions_per_turn=3)
    res = run(engine, renderer, sokoban_instances(1), agent=agent)
    t = res.trajectories[0]
    assert t.num_actions <= 10 and res.generation_calls <= 4  # 10 actions allowed: 3 + 3 + 3 + 1


def test_call_seed_is_a_pure_function():
    assert call_seed(0, 3, "train", 1) == call_seed(0, 3, "train", 1)
    seeds = {call_seed(s, i, m, t) for s in (0, 1) for i in range(3) for m in ("train", "val") for t in range(5)}
    assert len(seeds) == 2 * 3 * 2 * 5


def test_sampling_for_modes():
    cfg = load_config(None, ["cpu-small"], ["rollout.val_temperature=0.5"])
    assert sampling_for(cfg.rollout, "train").temperature == 1.0
    assert sampling_for(cfg.rollout, "val").temperature == 0.5
    assert sampling_for(cfg.rollout, "train").max_new_tokens == cfg.rollout.response_length == 32
    greedy = load_config(None, ["cpu-small"], ["rollout.val_do_sample=false"])
    assert sampling_for(greedy.rollout, "val").greedy


def test_collect_from_config_with_bandit(tokenizer, renderer):
    cfg = load_config(None, ["cpu-small"], ["envs.train.tags=[Bandit]", "envs.train.n_groups=[2]",
                                             "envs.train.group_size=3", *SMALL_BATCH])
    engine = ScriptedEngine(tokenizer, lambda call, prompt: "<think>pick</think><answer>phoenix</answer>")
    c = collect(cfg, engine, renderer, progress=False)
    df = c.rollouts
    assert len(df) == 6 and set(df["tag"]) == {"Bandit"} and (df["num_turns"] == 1).all()
    assert (df["num_format_errors"] == 0).all() and (df["num_actions"] == 1).all()
    assert c.metrics["Bandit/format_error_rate"] == 0.0 and "Bandit/pass@3" in c.metrics
    assert list(df["seed"]) == list(instances_for(cfg, "train", 0)["seed"])


def test_group_stats_hand_computed():
    df = pd.DataFrame({"group": [0, 0, 1, 1], "score": [1.0, 3.0, 2.0, 2.0]})
    std, mx, mean = group_stats(df)
    assert std == pytest.approx(math.sqrt(2) / 2)  # group 0: unbiased std sqrt(2); group 1: 0
    assert mx == pytest.approx(2.5) and mean == pytest.approx(2.0)


def test_instances_disagreeing_with_the_env_are_rejected(tokenizer, renderer):
    cfg = load_config(None, ["cpu-small"], ["envs.train.tags=[SimpleSokoban,FrozenLake,Bandit,LargerSokoban]",
                                             "envs.train.n_groups=[2,2,2,2]", "envs.train.group_size=2", *SMALL_BATCH])
    inst = instances_for(cfg, "train", 3)
    engine = ScriptedEngine(tokenizer, lambda call, prompt: "<answer>Up</answer>")
    run(engine, renderer, inst, specs=cfg.tag_specs())  # generated by this code: accepted for every env type
    inst.loc[1, "initial_state"] = "#####\n#P_X#\n#####"
    with pytest.raises(ValueError, match="resets to a different state"):
        run(engine, renderer, inst)


def test_watch_metrics_by_hand(tokenizer, renderer, fixed_room):
    """ROOM puts the player at row 2, column 2 (from 1). Group 0 (2 members): turn 1 states that position and
    walks two right, turn 2 states row 2, column 2 again (it is at column 4 now: wrong) and pushes: solved in 3
    actions. Group 1 (2 members) states no position and walks left into the wall for all 5 turns: not solved.
    So 4 of the 14 turns state a position, 2 of those 4 right; 4 actions per episode on average; one group all
    solved, one none."""
    from ragen.agent.parsing import NO_CLAIM, RIGHT_CLAIM, WRONG_CLAIM
    from ragen.rollout.metrics import watch_metrics

    good = ["<think>I am at row 2, column 2.</think><answer>Right || Right</answer>",
            "<think>I am at row 2, column 2 still</think><answer>Right</answer>"]
    stuck = "<think>no idea</think><answer>Left</answer>"
    frames = []
    for group, script in ((0, lambda call, prompt: good[min(call, 1)]), (1, lambda call, prompt: stuck)):
        inst = sokoban_instances(2, group_size=2).assign(group=group)
        res = run(ScriptedEngine(tokenizer, script), renderer, inst)
        frames.append(rollouts_frame(inst, res.trajectories))
    df = pd.concat(frames, ignore_index=True)
    assert [list(x) for x in df["turn_position_match"]] == [[RIGHT_CLAIM, WRONG_CLAIM]] * 2 + [[NO_CLAIM] * 5] * 2
    m = watch_metrics(df)
    assert m["think_position_stated"] == pytest.approx(4 / 14) and m["think_position_right"] == 0.5
    assert m["actions_per_episode"] == 4.0
    assert m["groups_all_success"] == 1.0 and m["groups_no_success"] == 1.0
    assert m["tokens_per_turn"] == pytest.approx(df["response_length"].sum() / 14)
    e = env_metrics(df)
    assert e["rollout/think_position_right"] == 0.5 and e["SimpleSokoban/groups_no_success"] == 1.0


def test_position_claims_and_env_cells():
    """The warm-start's wording, from 1; an env's agent cell from 0."""
    from ragen.agent.parsing import NO_CLAIM, RIGHT_CLAIM, WRONG_CLAIM, check_position_claim, position_claim
    from ragen.envs import get_tag

    assert position_claim("I am at row 4, column 2. The box is at row 3, column 2") == (4, 2)
    assert position_claim("i am at row 10 column 3") == (10, 3)
    assert position_claim("The box is at row 3, column 2") is None
    assert check_position_claim("I am at row 4, column 2.", (3, 1)) == RIGHT_CLAIM
    assert check_position_claim("I am at row 5, column 5.", (3, 1)) == WRONG_CLAIM
    assert check_position_claim("go left", (3, 1)) == NO_CLAIM
    assert check_position_claim("I am at row 1, column 1", None) == NO_CLAIM
    sok = get_tag("SimpleSokoban").make()
    sok.reset(seed=0, options={"room": ROOM})
    assert sok.agent_cell() == (1, 1)
    sok.step(4)  # Right
    assert sok.agent_cell() == (1, 2)
    lake = get_tag("FrozenLake").make()
    lake.reset(seed=3)
    assert lake.agent_cell() == lake.position
    maze = get_tag("Maze").make()
    maze.reset(seed=1)
    assert maze.agent_cell() == maze.player
    assert get_tag("Bandit").make().agent_cell() is None
