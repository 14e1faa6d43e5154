"""Reports: the trajectories page (real rollouts from the scripted engine) and the training-curve PNGs."""

import itertools
import math
import re
import struct

import pandas as pd
import pytest

from ragen.config import AgentConfig
from ragen.report.plots import plot_training_curves, training_series
from ragen.report.trajectories import render_trajectories_html, select_trajectories
from ragen.rollout.engine import Sampling
from ragen.rollout.episodes import play_episodes
from ragen.rollout.scripted import ScriptedEngine
from ragen.rollout.table import read_rollouts, rollouts_frame, write_rollouts

pytestmark = pytest.mark.unit

ROOM = "#######\n#P__XO#\n#_____#\n#######"
XSS = "<script>alert(1)</script> & co"
# Replies in request order: turn 1 for envs 0-3, then turn 2 for envs 1-3 (env 0 solves the room in turn 1).
REPLIES = [
    "<think>go right</think><answer>Right || Right || Right</answer>",  # env 0: solved, score 10.7 (best)
    f"<think>{XSS}</think><answer>Up</answer>",  # env 1: into the wall
    "I will not use tags <b>bold</b>",  # env 2: format error
    "<think>left</think><answer>Left</answer>",  # env 3
    "<think>two steps</think><answer>Right || Right</answer>",  # env 1: score -0.3 (worst)
    "<think>jump</think><answer>Jump</answer>",  # env 2: unknown action, format error again
    "<think>down</think><answer>Down</answer>",  # env 3
]


@pytest.fixture
def rollouts(tokenizer, renderer, monkeypatch, tmp_path):
    """Four Sokoban trajectories in two groups, all on ROOM, written and read back as a rollouts table."""
    from ragen.envs.sokoban.env import SokobanEnv

    original = SokobanEnv.reset

    def reset(self, *, seed=None, options=None):
        return original(self, seed=seed, options={**(options or {}), "room": ROOM})

    monkeypatch.setattr(SokobanEnv, "reset", reset)
    rows = [(0, "train", i, "SimpleSokoban", i // 2, i % 2, 7 + i // 2, None, "", None) for i in range(4)]
    inst = pd.DataFrame(rows, columns=["iteration", "mode", "env_id", "tag", "group", "member", "seed", "stream",
                                       "initial_state", "optimal_length"])
    inst["stream"] = inst["stream"].astype("Int64")
    order = itertools.count()
    engine = ScriptedEngine(tokenizer, lambda call, prompt: REPLIES[next(order)])
    res = play_episodes(engine, inst, AgentConfig(max_turn=2), renderer,
                           Sampling(temperature=1.0, max_new_tokens=64), max_model_len=4096, run_seed=0)
    df = read_rollouts(write_rollouts(rollouts_frame(inst, res.trajectories), tmp_path / "rollouts.parquet"))
    assert list(df["score"].round(6)) == [10.7, -0.3, -0.2, -0.2] and next(order) == len(REPLIES)
    return df


def sections(page):
    return re.findall(r'<section class="traj" id="traj-(\d+)">', page)


def test_page_shows_states_thoughts_actions_and_rewards(rollouts, renderer):
    page = render_trajectories_html(rollouts, decode=renderer.decode, title="Iteration <0> & co")
    assert sections(page) == ["0", "1", "2", "3"] and "Showing 4 of 4 trajectories" in page
    assert "<title>Iteration &lt;0&gt; &amp; co</title>" in page
    assert page.count(f'<pre class="state">{ROOM}</pre>') == 7  # no turn but env 0's moves the player
    for think in ("go right", "two steps", "left", "down"):
        assert f'<pre class="think">{think}</pre>' in page
    for action in ("Right", "Up", "Left", "Down", "Jump"):  # Jump: parsed, never executed
        assert f"<code>{action}</code>" in page
    for reward in ("10.7", "-0.1", "-0.2", "0"):
        assert f"reward <b>{reward}</b>" in page
    assert "score <b>10.7</b>" in page and "score <b>-0.3</b>" in page
    assert page.count('<div class="turn error">') == 2  # env 2's two turns
    assert page.count("format error</span>") == 2 and "no answer found" in page
    assert '<span class="badge best">' in page and '<span class="badge worst">' in page
    assert page == render_trajectories_html(rollouts, decode=renderer.decode, title="Iteration <0> & co")


def test_model_output_is_escaped_and_nothing_is_fetched(rollouts, renderer):
    page = render_trajectories_html(rollouts, decode=renderer.decode)
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    low = page.lower()
    assert "<script" not in low and "alert(1)</script>" not in low and "<b>bold" not in low
    for external in ("src=", "href=", "http:", "https:", "<link", "@import", "url("):
        assert external not in low


def test_n_caps_and_keeps_best_and_worst(rollouts, renderer):
    assert sections(render_trajectories_html(rollouts, n=2, decode=renderer.decode)) == ["0", "1"]
    page = render_trajectories_html(rollouts, n=3, decode=renderer.decode)
    assert sections(page) == ["0", "1", "2"] and "Showing 3 of 4 trajectories" in page
    assert "down" not in re.findall(r'<pre class="think">(.*?)</pre>', page)  # env 3 not shown
    assert len(sections(render_trajectories_html(rollouts, n=100))) == 4
    with pytest.raises(ValueError, match="n must be"):
        render_trajectories_html(rollouts, n=0)


def test_without_decode_the_table_fields_still_show(rollouts):
    page = render_trajectories_html(rollouts)
    assert "pass decode=" in page and '<pre class="think">' not in page and '<pre class="state">' not in page
    assert "<code>Right</code>" in page and "reward <b>10.7</b>" in page and "<code>Jump</code>" not in page
    assert "valid yes · effective no" in page  # env 1's walk into the wall


def test_empty_table_renders_a_page():
    page = render_trajectories_html(pd.DataFrame(columns=["tag", "group", "score"]))
    assert "Showing 0 of 0 trajectories" in page and not sections(page)


def test_selection_spreads_over_groups():
    rows = [{"group": g, "score": 0.0} for g in range(3) for _ in range(3)]
    rows[4]["score"], rows[5]["score"] = 5.0, -5.0  # best and worst, both in group 1
    assert select_trajectories(rows, 2) == [4, 5]
    assert select_trajectories(rows, 3) == [0, 4, 5]
    assert select_trajectories(rows, 4) == [0, 4, 5, 6]  # one of each group before a second of any
    assert select_trajectories(rows, 99) == list(range(9))


# -- training curves ---------------------------------------------------------------------------------------

METRICS = {
    0: {"train/Bandit/score": 1.0, "train/Bandit/non-zero/score": 2.0, "train/Bandit/success": 0.25,
        "actor/entropy_loss": 1.5, "actor/grad_norm": 0.5, "critic/grad_norm": float("nan"), "timing_s/step": 3.0},
    2: {"train/Bandit/score": 2.0, "val/score": 0.5, "val/Bandit/pass@4": 1.0, "actor/grad_norm": 0.7},
    1: {"train/Bandit/score": 1.5, "train/Bandit/success": 0.5, "actor/entropy_loss": 1.2},
}


def test_series_group_keys_into_families_with_nan_gaps():
    s = training_series(METRICS)
    assert list(s) == ["score", "success", "entropy", "grad_norm"]  # no in-group std keys: no family
    xs, lines = s["score"]
    assert xs == [0, 1, 2] and lines["train/Bandit/score"] == [1.0, 1.5, 2.0]
    assert set(lines) == {"train/Bandit/score", "val/score"}  # non-zero means left out
    assert [math.isnan(v) for v in lines["val/score"]] == [True, True, False]
    assert set(s["success"][1]) == {"train/Bandit/success", "val/Bandit/pass@4"}
    assert list(s["grad_norm"][1]) == ["actor/grad_norm"]  # critic/grad_norm is all NaN: no line
    assert math.isnan(s["grad_norm"][1]["actor/grad_norm"][1])
    assert training_series({0: {"timing_s/step": 1.0}}) == {}


def test_plots_are_png_files_for_present_families_only(tmp_path):
    paths = plot_training_curves(METRICS, tmp_path / "plots")
    assert [p.name for p in paths] == ["score.png", "success.png", "entropy.png", "grad_norm.png"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(p.name for p in paths)
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and data[-8:-4] == b"IEND"
        assert struct.unpack(">II", data[16:24]) == (700, 400)
    assert plot_training_curves({0: {"timing_s/step": 1.0}}, tmp_path / "none") == []
    assert not (tmp_path / "none").exists()
