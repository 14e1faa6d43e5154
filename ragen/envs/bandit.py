"""Bi-arm bandit: one step, a deterministic low-risk arm and a Bernoulli high-risk arm behind symbolic names."""

from __future__ import annotations

from typing import Any

from gymnasium import spaces

from ragen.envs.base import TextEnv, text_space

RULES = (
    "You are playing a two-armed bandit game. Your goal is to collect as much reward as possible by "
    "choosing one arm to pull.\n"
    "Rules:\n"
    "1. There are 2 arms: {first} and {second}.\n"
    "2. Each arm pays out from its own reward distribution, and that distribution is tied to the arm's name.\n"
    "3. Think about what each name symbolises and how an arm with that name might pay out.\n"
    "4. Choose the arm you expect to pay more on average, and answer with its name, "
    "like <answer> {first} </answer> or <answer> {second} </answer>."
)


class BanditEnv(TextEnv):
    """Arm ids 1 and 2 in a per-seed shuffled order. Low arm pays ``lo_arm_score``; high arm pays
    ``hi_arm_score`` with probability ``hi_arm_hiscore_prob`` and 0 otherwise. Success = high arm chosen."""

    def __init__(self, lo_arm_name: str = "Phoenix", hi_arm_name: str = "Dragon", lo_arm_score: float = 0.1,
                 hi_arm_score: float = 1.0, hi_arm_hiscore_prob: float = 0.25,
                 render_mode: str | None = None) -> None:
        super().__init__(render_mode)
        if not lo_arm_name.strip() or not hi_arm_name.strip():
            raise ValueError("arm names must be non-empty")
        if lo_arm_name.strip().lower() == hi_arm_name.strip().lower():
            raise ValueError(f"arm names must differ (case-insensitively), got {lo_arm_name!r} twice")
        if not 0.0 <= hi_arm_hiscore_prob <= 1.0:
            raise ValueError(f"hi_arm_hiscore_prob must be in [0, 1], got {hi_arm_hiscore_prob}")
        self.lo_arm_name, self.hi_arm_name = lo_arm_name, hi_arm_name
        self.lo_arm_score, self.hi_arm_score = float(lo_arm_score), float(hi_arm_score)
        self.hi_arm_hiscore_prob = float(hi_arm_hiscore_prob)
        self.action_space = spaces.Discrete(2, start=1)
        longest = max(len(lo_arm_name), len(hi_arm_name))
        self.observation_space = text_space(len(RULES) + 4 * longest + 64, (lo_arm_name, hi_arm_name))
        self._lookup: dict[int, str] = {}
        self._text = ""

    @property
    def action_lookup(self) -> dict[int, str]:
        if not self._lookup:
            raise RuntimeError("call reset() first")
        return dict(self._lookup)

    @property
    def hi_arm_id(self) -> int:
        return next(i for i, n in self.action_lookup.items() if n == self.hi_arm_name)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        rng = self._seed_streams(seed, options)
        if rng.random() < 0.5:
            self._lookup = {1: self.lo_arm_name, 2: self.hi_arm_name}
        else:
            self._lookup = {1: self.hi_arm_name, 2: self.lo_arm_name}
        self._text = RULES.format(first=self._lookup[1], second=self._lookup[2])
        return self._text, {"success": False}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        a = self._check_action(action)
        name = self._lookup[a]
        if name == self.lo_arm_name:
            reward = self.lo_arm_score
        else:
            reward = self.hi_arm_score if self.np_random.random() < self.hi_arm_hiscore_prob else 0.0
        self._text = f"{name}: {reward} points"
        info = {"action_is_effective": True, "action_is_valid": True, "success": name == self.hi_arm_name}
        return self._text, reward, True, False, info

    def render_text(self) -> str:
        return self._text
