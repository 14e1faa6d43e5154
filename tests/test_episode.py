"""Prompt layout, token-in/token-out assembly, masks and reward placement, with a scripted policy."""

import math

import pytest

from ragen.agent.chat import Kind
from ragen.agent.episode import Episode
from ragen.config import AgentConfig
from ragen.envs import get_tag

pytestmark = pytest.mark.unit

ROOM = "#######\n#P__XO#\n#_____#\n#######"  # Right, Right walk to the box; a third Right solves it


def char_ids(tok, text):
    """A deliberately non-canonical tokenisation (one token per character) that still decodes to ``text``."""
    return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]


def episode(renderer, tag="SimpleSokoban", room=ROOM, **agent):
    spec = get_tag(tag)
    options = {"room": room} if room and spec.env_type == "sokoban" else None
    return Episode(spec.make(), spec, AgentConfig(**agent), renderer, seed=1, reset_options=options)


def test_first_prompt_layout(tokenizer, renderer):
    ep = episode(renderer)
    text = tokenizer.decode(ep.prompt_ids())
    assert text.startswith("<|im_start|>system\nYou're a helpful assistant. <|im_end|>\n<|im_start|>user\n"
                           "You are solving the Sokoban puzzle.")
    pieces = ["\nThe meaning of each symbol in the state is:\n#: wall, _: empty, O: target, √: box on target, "
              "X: box, P: player, S: player on target",
              "\nYour available actions are:\nUp, Down, Left, Right",
              '\nYou can make up to 10 actions, separated by the action separator " || "\n',
              f"\nTurn 1:\nState:\n{ROOM}\nYou have 10 actions left. Always output: <think> [Your thoughts] </think>"
              " <answer> [your answer] </answer> with no extra text. Strictly follow this format. "
              "Max response length: 100 words (tokens).\n<|im_end|>\n<|im_start|>assistant\n<think>"]
    pos = 0
    for piece in pieces:
        found = text.find(piece, pos)
        assert found >= 0, piece
        pos = found + len(piece)
    assert pos == len(text)


def test_no_think_prompt(tokenizer, renderer):
    text = tokenizer.decode(episode(renderer, enable_think=False).prompt_ids())
    assert "Always output: <answer> [your answer] </answer> with no extra text." in text
    assert text.endswith("<|im_start|>assistant\n<answer>")


def test_token_in_token_out_with_scripted_policy(tokenizer, renderer):
    ep = episode(renderer)
    eot = renderer.end_of_turn_id
    script = ["I walk right.</think><answer>Right || Right</answer>", "again</think><answer>Right||Right</answer>"]
    sampled, prompts = [], []
    for i, text in enumerate(script):
        ids = char_ids(tokenizer, text) + [eot]
        assert ids != tokenizer.encode(text, add_special_tokens=False) + [eot]
        prompt = ep.prompt_ids()
        if prompts:  # every prompt extends the previous prompt + sampled ids exactly (prefix caching, TITO)
            prev = prompts[-1] + sampled[-1]
            assert prompt[:len(prev)] == prev
        prompts.append(prompt)
        sampled.append(ids)
        ep.record(ids, logprobs=[-0.01 * (i + 1)] * len(ids))
        if ep.done:
            break
    assert ep.done and ep.success
    traj = ep.assemble()
    got = [t for t, k in zip(traj.input_ids, traj.kinds, strict=True) if k == Kind.SAMPLED]
    assert got == [t for ids in sampled for t in ids]
    assert traj.input_ids[:len(prompts[-1])] == prompts[-1]
    assert traj.loss_mask == [k == Kind.SAMPLED for k in traj.kinds]
    assert all(math.isnan(lp) != m for lp, m in zip(traj.sampled_logprobs, traj.loss_mask, strict=True))
    assert traj.input_ids[-1] == eot and traj.turn_end_positions[-1] == len(traj.input_ids) - 1
    assert traj.turn_rewards == [pytest.approx(-0.2), 10.9]  # the solving step ends the turn early
    assert traj.rewards[-1] == pytest.approx(10.7) and sum(traj.rewards) == pytest.approx(10.7)
    assert traj.num_actions == 3 and traj.response_length == sum(map(len, sampled))
    assert traj.actions == [["Right", "Right"], ["Right"]]


def test_rebuilt_storage_reproduces_the_original(tokenizer, renderer):
    ep = episode(renderer, response_storage="rebuilt")
    ep.record(char_ids(tokenizer, " go</think>  <answer> right || Right </answer> junk"))
    traj = ep.assemble()
    assistant = [t for t, m in zip(traj.input_ids, traj.loss_mask, strict=True) if m]
    rebuilt = "<think>go</think><answer>right || Right</answer>"
    assert tokenizer.decode(assistant) == rebuilt + "<|im_end|>"
    assert assistant == tokenizer.encode(rebuilt, add_special_tokens=False) + [renderer.end_of_turn_id]
    assert all(math.isnan(x) for x in traj.sampled_logprobs)


def test_all_after_system_mask(tokenizer, renderer):
    ep = episode(renderer, loss_mask="all_after_system")
    ep.record(char_ids(tokenizer, "x</think><answer>Left</answer>") + [renderer.end_of_turn_id])
    traj = ep.assemble()
    first = traj.loss_mask.index(True)
    assert tokenizer.decode(traj.input_ids[:first]) == "<|im_start|>system\nYou're a helpful assistant. <|im_end|>\n"
    assert all(traj.loss_mask[first:])


def test_reward_messages_print_python_floats(tokenizer, renderer):
    ep = episode(renderer)
    ep.record(tokenizer.encode("a</think><answer>Up || Up || Up</answer>", add_special_tokens=False))
    text = tokenizer.decode(ep.prompt_ids())
    assert "Reward:\n-0.30000000000000004\n\nTurn 2:" in text
    assert "You have 7 actions left." in text
    ep.record(tokenizer.encode("a</think><answer>Jump</answer>", add_special_tokens=False))
    assert "Reward:\n0\n\nTurn 3:" in tokenizer.decode(ep.prompt_ids())


def test_format_penalty_accumulates_into_the_score(tokenizer, renderer):
    ep = episode(renderer)
    for text in ["no tags at all", "b</think><answer>Up || fly</answer>", "c</think><answer></answer>"]:
        ep.record(tokenizer.encode(text, add_special_tokens=False))
    traj = ep.assemble()
    assert traj.num_format_errors == 3 and traj.format_penalty == pytest.approx(-0.3)
    assert traj.score == pytest.approx(-0.1 - 0.3)  # one executed Up + three penalties
    assert traj.rewards[traj.turn_end_positions[-1]] == pytest.approx(traj.score)
    assert traj.action_is_valid == pytest.approx(1 / 3)


def test_turn_scores_place_each_turn_reward_without_penalty(tokenizer, renderer):
    ep = episode(renderer, use_turn_scores=True)
    ep.record(tokenizer.encode("a</think><answer>Right</answer>", add_special_tokens=False))
    ep.record(tokenizer.encode("nothing", add_special_tokens=False))
    traj = ep.assemble()
    assert [traj.rewards[p] for p in traj.turn_end_positions] == [pytest.approx(-0.1), 0.0]
    assert sum(traj.rewards) == pytest.approx(-0.1)


def test_action_budget_truncates(tokenizer, renderer):
    ep = episode(renderer, max_actions_per_turn=10)
    ep.record(tokenizer.encode("a</think><answer>" + " || ".join(["Up"] * 12) + "</answer>",
                               add_special_tokens=False))
    assert ep.done and ep.terminated and ep.truncated and not ep.success
    assert ep.num_actions == 10


def test_turn_limit_ends_unfinished_episode(tokenizer, renderer):
    ep = episode(renderer, max_turn=2)
    for _ in range(2):
        ep.record(tokenizer.encode("a</think><answer>Down || Up</answer>", add_special_tokens=False))
    assert ep.done and not ep.terminated and not ep.success
    with pytest.raises(RuntimeError):
        ep.prompt_ids()


def test_context_window_keeps_last_entries(tokenizer, renderer):
    ep = episode(renderer, max_context_window=1)
    ep.record(tokenizer.encode("a</think><answer>Down</answer>", add_special_tokens=False))
    text = tokenizer.decode(ep.prompt_ids())
    assert "Turn 2:" not in text and text.count("Turn 1:") == 1 and "You have 9 actions left." in text
    ep.record(char_ids(tokenizer, "b</think><answer>Up</answer>"))
    traj = ep.assemble()
    assert tokenizer.decode([t for t, m in zip(traj.input_ids, traj.loss_mask, strict=True) if m]) == \
        "b</think><answer>Up</answer>"


def test_bandit_episode_maps_names_case_insensitively(tokenizer, renderer):
    spec = get_tag("Bandit")
    ep = Episode(spec.make(), spec, AgentConfig(max_turn=1), renderer, seed=3)
    text = tokenizer.decode(ep.prompt_ids())
    assert "Your available actions" not in text and "Phoenix" in text
    ep.record(tokenizer.encode(" dragons are risky</think><answer> dRaGoN </answer>", add_special_tokens=False))
    traj = ep.assemble()
    assert ep.done and ep.success and traj.success and traj.actions == [["Dragon"]]
    assert traj.score in (0.0, 1.0)


def test_logprob_length_mismatch_is_an_error(tokenizer, renderer):
    ep = episode(renderer)
    with pytest.raises(ValueError, match="logprobs"):
        ep.record([1, 2, 3], logprobs=[0.0])


def test_truncated_sample_keeps_reward_on_a_trained_token(tokenizer, renderer):
    ep = episode(renderer)
    cut_short = char_ids(tokenizer, "I am still thinking about")  # no end-of-turn token: hit the length cap
    ep.record(cut_short)
    traj = ep.assemble()
    end = traj.turn_end_positions[-1]
    assert traj.loss_mask[end] and traj.rewards[end] == pytest.approx(-0.1)
    assert traj.input_ids[-len(cut_short):] == cut_short  # the sequence ends with the sampled tokens
    with pytest.raises(ValueError, match="no tokens"):
        episode(renderer).record([])
