"""Rollout metrics (docs/rollout.md), per tag and for the in-group reward spread."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ragen.agent.parsing import NO_CLAIM, RIGHT_CLAIM

PER_TRAJECTORY = ["success", "num_actions", "action_is_valid", "action_is_effective", "response_length", "score"]


def env_metrics(df: pd.DataFrame) -> dict[str, float]:
    """``{tag}/success``, ``num_actions``, ``action_is_valid``/``effective``, ``pass@{group size}``,
    ``response_length``, ``score``, ``format_error_rate`` (turns with a format error) and ``non-zero/*`` means;
    ``watch_metrics`` per tag and over all (``rollout/...``);
    plus the overall ``response_length`` and ``rollout/in_group_std|max|mean`` over raw scores."""
    out: dict[str, float] = {}
    for tag, sub in df.groupby("tag", sort=True):
        for m in PER_TRAJECTORY:
            vals = sub[m].astype(float)
            out[f"{tag}/{m}"] = float(vals.mean())
            nz = vals[vals != 0]
            out[f"{tag}/non-zero/{m}"] = float(nz.mean()) if len(nz) else 0.0
        sizes = sub.groupby("group").size()
        k = int(sizes.max())
        out[f"{tag}/pass@{k}"] = float(sub.groupby("group")["success"].any().mean())
        turns = np.concatenate([np.asarray(x, dtype=bool) for x in sub["turn_format_error"]])
        out[f"{tag}/format_error_rate"] = float(turns.mean()) if len(turns) else 0.0
        out.update({f"{tag}/{k}": v for k, v in watch_metrics(sub).items()})
    out["response_length"] = float(df["response_length"].mean())
    out.update({f"rollout/{k}": v for k, v in watch_metrics(df).items()})
    std, mx, mean = group_stats(df)
    out.update({"rollout/in_group_std": std, "rollout/in_group_max": mx, "rollout/in_group_mean": mean})
    return out


def watch_metrics(df: pd.DataFrame) -> dict[str, float]:
    """What to watch per iteration beside success: response tokens per turn, actions per episode, groups whose
    members all succeeded or all failed (no success signal, whatever their scores differ by), and how often a
    think that states the agent's position states it right."""
    solved = df.groupby("group")["success"].agg(["all", "any"])
    out = {"tokens_per_turn": float(df["response_length"].sum() / max(int(df["num_turns"].sum()), 1)),
           "actions_per_episode": float(df["num_actions"].mean()),
           "groups_all_success": float(solved["all"].sum()), "groups_no_success": float((~solved["any"]).sum())}
    if "turn_position_match" in df:
        claims = np.concatenate([np.asarray(x, dtype=np.int64) for x in df["turn_position_match"]] or [[]])
        stated = claims[claims != NO_CLAIM]
        out["think_position_stated"] = float(len(stated) / len(claims)) if len(claims) else 0.0
        if len(stated):
            out["think_position_right"] = float((stated == RIGHT_CLAIM).mean())
    return out


def group_stats(df: pd.DataFrame, column: str = "score") -> tuple[float, float, float]:
    """Per-group unbiased std, max and mean of the score, averaged over groups (std 0 for singleton groups):
    the same statistics the variance filter ranks by."""
    import torch

    from ragen.algos.filtering import group_stats as per_group

    _, std, mx, mean = per_group(torch.tensor(df[column].to_numpy(dtype=np.float64)),
                                 torch.tensor(df["group"].to_numpy()))
    return float(std.mean()), float(mx.mean()), float(mean.mean())
