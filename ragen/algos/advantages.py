"""Advantage estimators and score normalisation (docs/algorithms.md)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ragen.algos.masked import masked_whiten

NORM_EPS = 1e-6


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor | None = None,
        gamma: float = 1.0, lam: float = 1.0, whiten: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over every real position, as the original (no mask inside the recursion), V beyond the end = 0.

    rewards, values, mask, valid: (B, T). Returns (advantages, returns), both (B, T); returns = A + V are taken
    before the advantages are whitened over ``mask``. With gamma = lam = 1, A_t = sum_{u>=t} r_u - V_t."""
    valid_f = (torch.ones_like(rewards) if valid is None else valid.to(rewards.dtype))
    v = values * valid_f
    T = rewards.shape[1]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        next_v = v[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - v[:, t]
        last = (delta + gamma * lam * last) * valid_f[:, t]
        adv[:, t] = last
    returns = adv + v
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv * mask.to(adv.dtype), returns


def bi_level_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, turn_ends: torch.Tensor,
                 gamma: float = 1.0, lam: float = 1.0, high_level_gamma: float = 0.95,
                 whiten: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE with ``high_level_gamma`` over the turn ends, then token-level GAE inside each turn.

    ``turn_ends`` (B, T) bool marks the last trained token of every assistant turn. The original finds turns as
    nonzero-reward positions, which misses zero-reward turns and can index past the end; explicit ends avoid both.
    1. Backwards over ends e_k: A_k = r_k + g_h V(e_{k+1}) - V(e_k) + g_h lam A_{k+1}; r'(e_k) = A_k + V(e_k).
    2. Within turn k, from e_k back over its masked tokens (accumulator reset at each end):
       delta_t = r'_t + gamma V(next masked token of the turn) - V_t, A_t = delta_t + gamma lam A_next.
    Returns (advantages whitened over ``mask``, returns = A + V before whitening)."""
    adv = torch.zeros_like(rewards)
    ret = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        ends = torch.nonzero(turn_ends[b], as_tuple=False).flatten().tolist()
        if not ends:
            continue
        r, v, m = rewards[b], values[b], mask[b].bool()
        new_r = torch.zeros_like(r)
        a_next, v_next = torch.zeros(()), torch.zeros(())
        for k in reversed(range(len(ends))):
            e = ends[k]
            # a turn's reward: everything credited inside it (rewards sit on turn ends, but be general)
            start = ends[k - 1] + 1 if k > 0 else 0
            r_turn = r[start:e + 1].sum()
            a = r_turn + high_level_gamma * v_next - v[e] + high_level_gamma * lam * a_next
            new_r[e] = a + v[e]
            a_next, v_next = a, v[e]
        for k in range(len(ends)):
            start = ends[k - 1] + 1 if k > 0 else 0
            pos = [t for t in range(start, ends[k] + 1) if m[t]]
            if ends[k] not in pos:
                pos.append(ends[k])
            acc, nv = torch.zeros(()), torch.zeros(())
            for t in reversed(pos):
                delta = new_r[t] + gamma * nv - v[t]
                acc = delta + gamma * lam * acc
                adv[b, t], ret[b, t] = acc, acc + v[t]
                nv = v[t]
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv * mask.to(adv.dtype), ret


def group_index(keys: Sequence) -> torch.Tensor:
    """Dense group index (0..G-1) for arbitrary hashable keys, in order of first appearance."""
    seen: dict = {}
    return torch.tensor([seen.setdefault(k, len(seen)) for k in keys], dtype=torch.long)


def normalize_scores(scores: torch.Tensor, groups: torch.Tensor, method: str = "identity") -> torch.Tensor:
    """Score normalisation within groups (docs/algorithms.md). scores, groups: (B,). Methods: identity; mean (x - mean);
    mean_std ((x - mean) / (std + 1e-6), unbiased std, all zeros when std <= 1e-6); asym_clip (mean_std clamped
    to [-1, 3]). Nothing changes when every group is a single sample (the original normalises only when there
    are fewer groups than samples)."""
    if method == "identity":
        return scores.clone()
    if method not in ("mean", "mean_std", "asym_clip"):
        raise ValueError(f"unknown normalisation method {method!r}; use identity, mean, mean_std or asym_clip")
    out = scores.clone().to(torch.float64)
    if int(groups.unique().numel()) >= scores.numel():
        return out.to(scores.dtype)
    for g in groups.unique():
        sel = groups == g
        x = out[sel]
        mean = x.mean()
        if method == "mean":
            out[sel] = x - mean
            continue
        std = x.std(unbiased=True) if x.numel() > 1 else torch.zeros((), dtype=x.dtype)
        out[sel] = torch.zeros_like(x) if std <= NORM_EPS else (x - mean) / (std + NORM_EPS)
    if method == "asym_clip":
        out = out.clamp(-1.0, 3.0)
    return out.to(scores.dtype)


def grpo(scores: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor, norm: str = "mean_std",
         length_weight: bool = False) -> torch.Tensor:
    """GRPO with a real group baseline: per seed group, A_i = (R_i - mean) / (std + 1e-6) (``mean_std``) or
    R_i - mean (``mean``), zero for a zero-variance group; broadcast over each trajectory's masked tokens.
    ``length_weight`` divides A_i by n_i / mean_j n_j (n = masked tokens). scores, groups: (B,); mask (B, T)."""
    if norm not in ("mean", "mean_std"):
        raise ValueError(f"GRPO baseline norm must be mean or mean_std, got {norm!r}")
    a = torch.zeros_like(scores, dtype=torch.float64)
    s = scores.to(torch.float64)
    for g in groups.unique():
        sel = groups == g
        x = s[sel]
        std = x.std(unbiased=True) if x.numel() > 1 else torch.zeros((), dtype=x.dtype)
        if std <= NORM_EPS:
            continue  # no signal in this group
        a[sel] = (x - x.mean()) / (std + NORM_EPS) if norm == "mean_std" else x - x.mean()
    if length_weight:
        n = mask.to(torch.float64).sum(-1)
        a = a / ((n + NORM_EPS) / n.mean())
    m = mask.to(torch.float32)
    return a.to(torch.float32)[:, None] * m


# every estimator, and whether it needs a critic's values: the one place that says so (the trainer builds, scores
# and checkpoints a critic exactly when needs_critic says)
ESTIMATORS = {"gae": True, "grpo": False}


def needs_critic(estimator: str) -> bool:
    if estimator not in ESTIMATORS:
        raise ValueError(f"algorithm.adv_estimator must be one of {sorted(ESTIMATORS)}, got {estimator!r}")
    return ESTIMATORS[estimator]


def compute_advantages(estimator: str, *, rewards: torch.Tensor, values: torch.Tensor | None, scores: torch.Tensor,
                       groups: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor | None = None,
                       turn_ends: torch.Tensor | None = None, gamma: float = 1.0, lam: float = 1.0,
                       bi_level: bool = False, high_level_gamma: float = 0.95, grpo_norm: str = "mean_std",
                       length_weight: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The one dispatch over estimators: (advantages, returns), each ``(batch, length)``; returns are None for
    estimators without a critic. ``rewards`` are token rewards, ``scores`` one per trajectory (GRPO's input)."""
    if needs_critic(estimator) and values is None:
        raise ValueError(f"algorithm.adv_estimator={estimator} needs the critic's values")
    if estimator == "grpo":
        return grpo(scores, groups, mask, norm=grpo_norm, length_weight=length_weight), None
    if bi_level:
        if turn_ends is None:
            raise ValueError("bi-level GAE needs the turn ends")
        return bi_level_gae(rewards, values, mask, turn_ends, gamma=gamma, lam=lam,  # type: ignore[arg-type]
                            high_level_gamma=high_level_gamma)
    return gae(rewards, values, mask, valid, gamma=gamma, lam=lam)  # type: ignore[arg-type]
