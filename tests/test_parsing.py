import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen.agent.parsing import format_answer, map_actions, parse_response

pytestmark = pytest.mark.unit

SOKOBAN = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}


def test_think_answer_match_and_rebuild():
    p = parse_response("<think> go up </think>\n <answer> Up || left ||  </answer> trailing")
    assert p.matched and p.think == "go up" and p.answer == "Up || left ||"  # kept as written unless capped
    assert p.actions == ("Up", "left")
    assert p.rebuilt == "<think>go up</think><answer>Up || left ||</answer>"


def test_first_match_wins_and_tokens_are_stripped():
    p = parse_response("<think>a</think><answer>Down<|im_end|></answer><think>b</think><answer>Up</answer>")
    assert p.actions == ("Down",)
    assert p.think == "a"


def test_cap_per_turn_rejoins_answer():
    p = parse_response("<think>x</think><answer>Up||Up||Up||Up||Up||Up||Up</answer>", max_actions=5)
    assert p.actions == ("Up",) * 5 and p.truncated
    assert p.answer == "Up || Up || Up || Up || Up"


def test_no_match_keeps_raw_text():
    raw = "<think>I never close the tag <answer>Up</answer>"
    p = parse_response(raw)
    assert not p.matched and p.actions == () and p.rebuilt == raw
    p = parse_response("<answer>Up</answer>")  # think required when enable_think
    assert not p.matched


def test_no_think_mode():
    p = parse_response("<answer> Left || Up </answer>", enable_think=False)
    assert p.actions == ("Left", "Up") and p.rebuilt == "<answer>Left || Up</answer>" and p.think == ""


def test_mapping_is_case_insensitive_and_penalises_unknown_names():
    m = map_actions(("  uP ", "RIGHT", "jump"), SOKOBAN)
    assert m.ids == (1, 4) and m.n_parsed == 3 and m.format_error
    assert not map_actions(("Up", "Down"), SOKOBAN).format_error
    assert map_actions((), SOKOBAN).format_error  # nothing valid is a format error too


@settings(max_examples=500, deadline=None)
@given(st.text(), st.booleans(), st.integers(1, 8))
def test_parser_never_raises(text, think, cap):
    p = parse_response(text, enable_think=think, max_actions=cap)
    assert len(p.actions) <= cap
    assert all(a == a.strip() and a for a in p.actions)
    map_actions(p.actions, SOKOBAN)


TAGLESS = st.text(alphabet=st.characters(blacklist_characters="<>|", blacklist_categories=("Cs",)), max_size=40)
ACTION = st.sampled_from(["Up", "Down", "Left", "Right", "up", "RIGHT"])


@settings(max_examples=300, deadline=None)
@given(st.lists(ACTION, min_size=1, max_size=5), TAGLESS)
def test_valid_answers_round_trip(actions, think):
    text = format_answer(actions, think=think)
    p = parse_response(text)
    assert p.matched and list(p.actions) == actions and p.think == think.strip()
    assert parse_response(p.rebuilt) == p  # the rebuilt text parses to the same thing
    assert map_actions(p.actions, SOKOBAN).n_valid == len(actions)


@settings(max_examples=200, deadline=None)
@given(st.lists(ACTION, min_size=1, max_size=5), TAGLESS, TAGLESS)
def test_noise_around_tags_is_ignored(actions, before, after):
    p = parse_response(before + format_answer(actions, think="t") + after)
    assert list(p.actions) == actions
