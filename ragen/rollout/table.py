"""The rollouts table: one row per trajectory, the instance it came from beside its training data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from ragen.agent.episode import Trajectory
from ragen.tables import read_table, write_table

KEYS = ["iteration", "mode", "env_id", "tag", "group", "member", "seed"]
SEQUENCE = ["input_ids", "loss_mask", "sampled_logprobs", "kinds", "reward_positions", "reward_values"]
PER_TURN = ["turn_actions", "turn_valid", "turn_effective", "turn_rewards", "turn_format_error",
            "turn_end_positions", "turn_finish_reasons", "turn_position_match"]
ADDED_LATER = {"turn_position_match"}  # columns that tables written by earlier versions lack
SCALARS = ["score", "success", "format_penalty", "num_format_errors", "response_length", "num_turns",
           "num_actions", "action_is_valid", "action_is_effective", "terminated", "truncated", "context_exhausted",
           "length"]
COLUMNS = KEYS + SEQUENCE + PER_TURN + SCALARS


def rollouts_frame(instances: pd.DataFrame, trajectories: Sequence[Trajectory]) -> pd.DataFrame:
    """Join trajectories (in instance order) with their instance keys. Rewards are stored sparsely as
    (position, value) pairs: a reward sits on a turn's last trainable token."""
    if len(instances) != len(trajectories):
        raise ValueError(f"{len(trajectories)} trajectories for {len(instances)} instances")
    rows = []
    for key, t in zip(instances[KEYS].itertuples(index=False), trajectories, strict=True):
        d = asdict(t)
        rewards = np.asarray(d.pop("rewards"), dtype=np.float64)
        pos = np.flatnonzero(rewards)
        row = dict(zip(KEYS, key, strict=True))
        row.update(
            input_ids=np.asarray(t.input_ids, dtype=np.int32), loss_mask=np.asarray(t.loss_mask, dtype=bool),
            sampled_logprobs=np.asarray(t.sampled_logprobs, dtype=np.float32),
            kinds=np.asarray(t.kinds, dtype=np.int8), reward_positions=pos.astype(np.int32),
            reward_values=rewards[pos], turn_actions=[list(a) for a in t.actions], turn_valid=t.turn_valid,
            turn_effective=t.turn_effective, turn_rewards=t.turn_rewards, turn_format_error=t.turn_format_error,
            turn_end_positions=t.turn_end_positions, turn_finish_reasons=t.turn_finish_reasons,
            turn_position_match=t.turn_position_match, length=len(t.input_ids))
        row.update({k: d[k] for k in SCALARS if k in d})
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def dense_rewards(row: pd.Series) -> np.ndarray:
    """Per-token rewards of one trajectory (zeros except at reward positions)."""
    out = np.zeros(int(row["length"]), dtype=np.float64)
    out[np.asarray(row["reward_positions"], dtype=np.int64)] = np.asarray(row["reward_values"], dtype=np.float64)
    return out


def write_rollouts(df: pd.DataFrame, path: str | Path) -> Path:
    return write_table(df, path)


def read_rollouts(path: str | Path) -> pd.DataFrame:
    return read_table(path, "rollouts", [c for c in COLUMNS if c not in ADDED_LATER],
                      "collect it again with `ragen rollout`")
