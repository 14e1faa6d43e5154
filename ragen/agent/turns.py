"""Executing one turn's actions in an env (docs/environments.md): sequential, summed rewards, stop at ``done``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragen.envs.base import TextEnv


@dataclass(frozen=True)
class TurnOutcome:
    reward: float | int  # summed; the int 0 when nothing was executed (printed as "0" in the next prompt)
    executed: tuple[int, ...]
    done: bool  # the env reached terminated or truncated
    info: dict[str, Any] = field(default_factory=dict)  # the last executed action's info ({} if none)
    state: str = ""

    @property
    def success(self) -> bool:
        return bool(self.info.get("success", False))


def execute_turn(env: TextEnv, action_ids: Sequence[int], actions_left: int) -> TurnOutcome:
    """Run at most ``actions_left`` of the valid actions in order; extra actions are dropped silently."""
    reward: float | int = 0
    executed: list[int] = []
    info: dict[str, Any] = {}
    done = False
    for a in list(action_ids)[:max(actions_left, 0)]:
        _, r, terminated, truncated, info = env.step(a)
        reward += r
        executed.append(a)
        if terminated or truncated:
            done = True
            break
    return TurnOutcome(reward, tuple(executed), done, dict(info), env.render_text())
