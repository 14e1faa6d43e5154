"""Shared contract of the text environments: gymnasium API, text observations, seeded streams."""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ragen.envs.seeding import dynamics_seed, layout_rng

BASE_CHARSET = frozenset(string.printable)


def text_space(max_length: int, extra_chars: Iterable[str] = ()) -> spaces.Text:
    chars = set(BASE_CHARSET)
    for s in extra_chars:
        chars.update(s)
    return spaces.Text(max_length=max_length, min_length=0, charset="".join(sorted(chars)))


class TextEnv(gym.Env[str, np.int64]):
    """Base class. Subclasses implement ``_reset_state(layout_rng, options)``, ``_step`` and ``render_text``.

    ``reset(seed, options={"member": m})``: the seed fixes the initial state; ``member`` selects the member's own
    dynamics stream (omit it, or pass None, for the stream the whole group shares).
    ``action_lookup`` maps action ids to the names the agent may answer with (valid after reset).
    """

    metadata: Mapping[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, render_mode: str | None = None) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode

    # -- seeding -------------------------------------------------------------------------------------------
    def _seed_streams(self, seed: int | None, options: Mapping[str, Any] | None) -> np.random.Generator:
        member = (options or {}).get("member")
        if member is not None and (not isinstance(member, int | np.integer) or member < 0):
            raise ValueError(f"reset option 'member' must be a non-negative int or None, got {member!r}")
        if seed is None:
            super().reset(seed=None)
            return np.random.default_rng(int(self.np_random.integers(2**63)))
        if not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        super().reset(seed=dynamics_seed(int(seed), None if member is None else int(member)))
        return layout_rng(int(seed))

    # -- gymnasium API ---------------------------------------------------------------------------------------
    @property
    def action_lookup(self) -> dict[int, str]:
        raise NotImplementedError

    def render_text(self) -> str:
        raise NotImplementedError

    def agent_cell(self) -> tuple[int, int] | None:
        """Where the agent stands now as (row, column) from 0, in a grid env; None where there is no position.
        The rollout checks the position a think claims against it (``ragen.agent.parsing.position_claim``)."""
        return None

    def optimal_length(self) -> int | None:
        """The optimal action count from the current initial state where one is defined (None: not defined, e.g.
        a one-step env). Written into the instances table; instances.py calls it right after reset."""
        return None

    def render(self) -> str | None:  # type: ignore[override]
        return self.render_text() if self.render_mode == "ansi" else None

    def _check_action(self, action: Any) -> int:
        try:
            a = int(action)
        except (TypeError, ValueError):
            raise ValueError(f"action must be an int id, got {action!r}") from None
        if a not in self.action_lookup:
            raise ValueError(f"action {a} is not one of {sorted(self.action_lookup)}")
        return a
