"""Parsing of model answers (docs/environments.md, agent I/O): first think/answer match, ``||`` split, per-turn cap."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

THINK_PATTERN = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
ANSWER_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
STRIPPED_STRINGS = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")
DEFAULT_ACTION_SEP = "||"
# the position a think states, as the warm-start's demonstrations word it ("I am at row 4, column 2", from 1)
POSITION_CLAIM = re.compile(r"\bI am at row (\d+),? column (\d+)", re.IGNORECASE)
# turn_position_match codes: the think stated no position / a wrong one / the agent's own
NO_CLAIM, WRONG_CLAIM, RIGHT_CLAIM = -1, 0, 1


@dataclass(frozen=True)
class ParsedResponse:
    """``actions`` are the raw action strings (after the cap); ``rebuilt`` is the original's cleaned text."""

    matched: bool
    think: str
    answer: str
    actions: tuple[str, ...]
    rebuilt: str
    truncated: bool  # more than max_actions_per_turn actions were given (dropped without penalty)


def _clean(text: str) -> str:
    for s in STRIPPED_STRINGS:
        text = text.replace(s, "")
    return text.strip()


def parse_response(text: str, *, enable_think: bool = True, max_actions: int = 5,
                   action_sep: str = DEFAULT_ACTION_SEP) -> ParsedResponse:
    """Parse a full response (forced prefix already re-attached). Never raises on any string."""
    if max_actions < 1:
        raise ValueError(f"max_actions must be >= 1, got {max_actions}")
    if not action_sep:
        raise ValueError("action_sep must be a non-empty string")
    match = (THINK_PATTERN if enable_think else ANSWER_PATTERN).search(text)
    if match is None:
        return ParsedResponse(False, "", "", (), text, False)
    think = _clean(match.group(1)) if enable_think else ""
    answer = _clean(match.group(2) if enable_think else match.group(1))
    actions = [a.strip() for a in answer.split(action_sep) if a.strip()]
    truncated = len(actions) > max_actions
    if truncated:
        actions = actions[:max_actions]
        answer = f" {action_sep} ".join(actions)
    rebuilt = f"<think>{think}</think><answer>{answer}</answer>" if enable_think else f"<answer>{answer}</answer>"
    return ParsedResponse(True, think, answer, tuple(actions), rebuilt, truncated)


def format_answer(actions: list[str] | tuple[str, ...], think: str | None = None,
                  action_sep: str = DEFAULT_ACTION_SEP) -> str:
    """The canonical well-formed response for a list of actions (demos, tests)."""
    answer = f"<answer>{f' {action_sep} '.join(actions)}</answer>"
    return answer if think is None else f"<think>{think}</think>{answer}"


@dataclass(frozen=True)
class MappedActions:
    ids: tuple[int, ...]  # valid actions in order
    n_parsed: int
    n_valid: int

    @property
    def format_error(self) -> bool:
        """The turn earns the format penalty: no valid action, or any unknown action name."""
        return self.n_valid == 0 or self.n_valid != self.n_parsed


def map_actions(actions: tuple[str, ...] | list[str], lookup: Mapping[int, str]) -> MappedActions:
    """Match action names case-insensitively after stripping; unknown names are dropped (and penalised)."""
    by_name = {name.strip().lower(): i for i, name in lookup.items()}
    ids = tuple(by_name[a.strip().lower()] for a in actions if a.strip().lower() in by_name)
    return MappedActions(ids, len(actions), len(ids))


def position_claim(think: str) -> tuple[int, int] | None:
    """The (row, column) the think says the agent stands at, counted from 1, or None if it says none."""
    m = POSITION_CLAIM.search(think)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def check_position_claim(think: str, cell: tuple[int, int] | None) -> int:
    """``RIGHT_CLAIM`` when the think's stated position is the agent's ``cell`` (row, column from 0),
    ``WRONG_CLAIM`` when it is another, ``NO_CLAIM`` when the think states none or the env has no position."""
    claim = position_claim(think)
    if claim is None or cell is None:
        return NO_CLAIM
    return RIGHT_CLAIM if claim == (cell[0] + 1, cell[1] + 1) else WRONG_CLAIM
