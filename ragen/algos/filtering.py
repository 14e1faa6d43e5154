"""Variance-based trajectory filtering of StarPO-S (docs/algorithms.md), on raw scores by default.

Groups are ranked by in-group reward spread and whole groups are kept. ``std`` keeps the top int(ratio x G)
groups by unbiased std, ``std_rev`` the lowest, ``max_mean`` the top by max - mean; ``top_p`` (RAGEN-2 style)
keeps the fewest highest-variance groups whose variance sums to at least ``ratio`` of the total. Ties keep the
earlier group (stable order)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FilterResult:
    keep: torch.Tensor  # (B,) bool over trajectories
    kept_groups: list[int]
    metrics: dict[str, float]


def group_stats(scores: torch.Tensor, groups: torch.Tensor) -> tuple[list[int], torch.Tensor, torch.Tensor,
                                                                      torch.Tensor]:
    """Group ids in first-seen order and their unbiased std, max and mean (std 0 for singletons)."""
    ids: list[int] = []
    for g in groups.tolist():
        if g not in ids:
            ids.append(g)
    std, mx, mean = [], [], []
    for g in ids:
        x = scores[groups == g].to(torch.float64)
        std.append(x.std(unbiased=True) if x.numel() > 1 else torch.zeros((), dtype=torch.float64))
        mx.append(x.max())
        mean.append(x.mean())
    return ids, torch.stack(std), torch.stack(mx), torch.stack(mean)


def filter_groups(scores: torch.Tensor, groups: torch.Tensor, ratio: float, kind: str = "std") -> FilterResult:
    """scores, groups: (B,). Returns which trajectories to keep and the rollout/*in_group* metrics."""
    if not 0 < ratio <= 1:
        raise ValueError(f"filter ratio must be in (0, 1], got {ratio}")
    ids, std, mx, mean = group_stats(scores, groups)
    G = len(ids)
    if kind in ("std", "std_rev", "max_mean"):
        key = {"std": std, "std_rev": -std, "max_mean": mx - mean}[kind]
        n_keep = G if ratio >= 1 else max(1, int(ratio * G))
        order = sorted(range(G), key=lambda i: -float(key[i]))  # stable: ties keep the earlier group
        chosen = sorted(order[:n_keep])
    elif kind == "top_p":
        var = std**2
        total = float(var.sum())
        if ratio >= 1 or total <= 0:
            chosen = list(range(G))
        else:
            order = sorted(range(G), key=lambda i: -float(var[i]))
            acc, chosen = 0.0, []
            for i in order:
                chosen.append(i)
                acc += float(var[i])
                if acc >= ratio * total - 1e-12:
                    break
            chosen.sort()
    else:
        raise ValueError(f"filter_type must be std, std_rev, max_mean or top_p, got {kind!r}")
    kept = [ids[i] for i in chosen]
    keep = torch.isin(groups, torch.tensor(kept, dtype=groups.dtype))
    idx = torch.tensor(chosen)
    metrics = {"rollout/in_group_std": float(std.mean()), "rollout/in_group_max": float(mx.mean()),
               "rollout/in_group_mean": float(mean.mean()), "rollout/chosen_in_group_std": float(std[idx].mean()),
               "rollout/chosen_in_group_max": float(mx[idx].mean()),
               "rollout/chosen_in_group_mean": float(mean[idx].mean()), "rollout/kept_groups": float(len(kept)),
               "rollout/kept_trajectories": float(keep.sum())}
    return FilterResult(keep, kept, metrics)
