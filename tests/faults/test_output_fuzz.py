"""Adversarial model output through the whole rollout path of an iteration (hypothesis drives a scripted engine):
multi-turn collection on Sokoban, FrozenLake and Bandit, the rollouts table written and read back, the StarPO-S
filter, the training sequences, and the trajectory page. Special-token strings, chat-role headers, huge outputs,
token ids that decode to invalid UTF-8 and answers with 10k actions must neither crash anything nor break the
bookkeeping (lengths, masks, finite bounded scores), and what the model wrote never reaches the page unescaped."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ledger import declares

from ragen.config import load_config
from ragen.report.trajectories import render_trajectories_html
from ragen.rollout.runner import collect
from ragen.rollout.scripted import ScriptedEngine
from ragen.rollout.table import read_rollouts, write_rollouts
from ragen.train.batch import sequences_from_rollouts
from ragen.train.trainer import filter_rollouts

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>system\n", "<|im_start|>user\nReward: 10\n",
           "<think>", "</think>", "<answer>", "</answer>", "<answer><answer>", "||", "<script>alert(1)</script>",
           "Up", "Down", "Left", "Right", "Phoenix", "Dragon", "\x00", "\ufffd", "\u202e", "💥"]
# above any score an episode here can reach (a solved one-box Sokoban scores 10.9 at most)
MAX_SCORE = 11.0


def fragments(tokenizer, kind):
    byte_ids = [i for t, i in tokenizer.get_vocab().items() if len(t) == 1 and ord(t) >= 0x80][:64]
    return {
        "special tokens": st.lists(st.sampled_from(SPECIAL) | st.text(max_size=12), max_size=12).map("".join),
        "huge outputs": st.sampled_from(SPECIAL).map(lambda s: s * 4000),
        "up to 10k actions": st.integers(1, 10_000).map(
            lambda n: "<think>x</think><answer>" + " || ".join(["Left"] * n) + "</answer>"),
        # stray byte-level pieces: half a UTF-8 character, which no decode can turn into valid text
        "invalid UTF-8": st.lists(st.sampled_from(byte_ids), min_size=1, max_size=40),
        "random token ids": st.lists(st.integers(0, len(tokenizer) - 1), max_size=80),
    }[kind]


KINDS = ["special tokens", "huge outputs", "up to 10k actions", "invalid UTF-8", "random token ids"]
LONG = ("huge outputs", "up to 10k actions")
# the long kinds cost seconds per example: a few drawn ones plus their largest input, always tried
LARGEST = {"huge outputs": [max(SPECIAL, key=len) * 4000] * 6,
           "up to 10k actions": ["<think>x</think><answer>" + " || ".join(["Left"] * 10_000) + "</answer>"] * 6}
EXAMPLES = {kind: 3 if kind in LONG else 10 for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
@declares(("model output fuzzing: {kind}", "simulated"))  # a scripted engine plays the model
def test_adversarial_output_through_the_rollout_path(tokenizer, renderer, tmp_path, fault, kind):
    fault(f"model output fuzzing: {kind}")
    cfg = load_config(None, ["cpu-small"], [
        "envs.train.tags=[SimpleSokoban, FrozenLake, Bandit]", "envs.train.n_groups=[1, 1, 1]",
        "envs.train.group_size=2", "agent.max_turn=3", "agent.max_actions_per_turn=5", "agent.enable_think=true",
        "algorithm.filter_ratio=0.5", "actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2",
        # the long kinds reach the parser whole (a 64-token cap would cut them first); the others keep a short cap
        *(["rollout.response_length=50000", "rollout.max_model_len=200000"] if kind in LONG
          else ["rollout.response_length=64"])])

    @settings(max_examples=EXAMPLES[kind], deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(replies=st.lists(fragments(tokenizer, kind), min_size=1, max_size=6))
    def check(replies):
        engine = ScriptedEngine(tokenizer, lambda call, prompt: replies[call % len(replies)])
        df = collect(cfg, engine, renderer, progress=False).rollouts
        assert len(df) == 6
        if kind in LONG:  # the first reply came back whole: not cut before the parser saw it
            assert len(engine.log[0][1]) >= len(tokenizer.encode(replies[0], add_special_tokens=False))
        for _, row in df.iterrows():
            n = int(row["length"])
            assert len(row["input_ids"]) == len(row["loss_mask"]) == len(row["sampled_logprobs"]) == n
            assert math.isfinite(row["score"]) and -3.0 <= row["score"] <= MAX_SCORE
            assert 1 <= row["num_turns"] <= 3 and row["num_actions"] <= 3 * 5
        back = read_rollouts(write_rollouts(df, tmp_path / "rollouts.parquet"))
        assert back["score"].tolist() == df["score"].tolist()
        assert all(np.array_equal(a, b) for a, b in zip(back["input_ids"], df["input_ids"], strict=True))
        kept, metrics = filter_rollouts(cfg, back)
        assert metrics["rollout/kept_groups"] == 1 and len(kept) == 2  # int(0.5 x 3 groups), whole groups
        seqs = sequences_from_rollouts(kept)
        assert all(len(i) == len(m) for i, m in zip(seqs.input_ids, seqs.loss_mask, strict=True))
        page = render_trajectories_html(back, n=6, decode=lambda ids: tokenizer.decode(list(ids)))
        assert "<script>alert" not in page and page.endswith("</html>\n")

    (example(replies=LARGEST[kind])(check) if kind in LARGEST else check)()
