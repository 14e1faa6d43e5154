"""Policy, value, entropy and KL terms (docs/algorithms.md).

Aggregation takes its denominator from the caller so that a mini-batch split into micro-batches (or across
ranks) gives exactly the loss of the whole mini-batch: ``token-mean`` divides by the mini-batch's masked-token
count, the ``seq-mean-*`` modes by its number of trajectories."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ragen.algos.masked import masked_mean

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, denom: float | None = None,
             norm_length: int | None = None) -> torch.Tensor:
    """Aggregate a (B, T) per-token loss over ``mask``.

    - token-mean: sum(l * m) / denom (denom: masked tokens of the whole mini-batch; default this batch's)
    - seq-mean-token-sum: sum_i (sum_t l m) / denom (denom: trajectories of the mini-batch; default B)
    - seq-mean-token-mean: sum_i (sum_t l m / n_i) / denom (the paper's Eq. 4)
    - seq-mean-token-sum-norm: sum_i (sum_t l m) / norm_length / denom (veRL divides by the padded length;
      ``norm_length`` fixes it so packing cannot change the loss)"""
    m = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        d = m.sum().clamp(min=1) if denom is None else denom
        return (loss_mat * m).sum() / d
    seq_sum = (loss_mat * m).sum(-1)
    d = loss_mat.shape[0] if denom is None else denom
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / d
    if mode == "seq-mean-token-mean":
        return (seq_sum / m.sum(-1).clamp(min=1)).sum() / d
    if mode == "seq-mean-token-sum-norm":
        return seq_sum.sum() / (norm_length or loss_mat.shape[-1]) / d
    raise ValueError(f"loss_agg_mode must be one of {AGG_MODES}, got {mode!r}")


@dataclass
class PolicyTerms:
    loss_mat: torch.Tensor  # (B, T) per-token policy loss after both clips
    clipped: torch.Tensor  # (B, T) bool: the clipped term was the larger (pg_clipfrac)
    dual_clipped: torch.Tensor  # (B, T) bool: the dual clip bound (pg_clipfrac_lower)
    neg_approx_kl: torch.Tensor  # (B, T): log pi_old - log pi (ppo_kl)


def policy_terms(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float = 0.2,
                 clip_high: float = 0.28, clip_c: float | None = 3.0) -> PolicyTerms:
    """PPO clipped surrogate with decoupled clip [1 - low, 1 + high] and the dual clip c for A < 0:
    l = max(-A r, -A clip(r)); for A < 0, l = min(l, -A c)."""
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    l1 = -advantages * ratio
    l2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped_max = torch.maximum(l1, l2)
    clipped = l2 > l1
    if clip_c is None:
        return PolicyTerms(clipped_max, clipped, torch.zeros_like(clipped), -log_ratio)
    if clip_c <= 1.0:
        raise ValueError(f"dual clip c must be > 1, got {clip_c}")
    l3 = -advantages * clip_c
    neg = advantages < 0
    dual = neg & (clipped_max > l3)
    loss = torch.where(neg, torch.minimum(clipped_max, l3), clipped_max)
    return PolicyTerms(loss, clipped, dual, -log_ratio)


def value_terms(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                clip: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss per token: 0.5 * max((V - G)^2, (clip(V, V_old +- c) - G)^2), and where the clip bound."""
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    l1 = (values - returns) ** 2
    l2 = (v_clipped - returns) ** 2
    return 0.5 * torch.maximum(l1, l2), l2 > l1


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) z over the last axis (pass logits already divided by the temperature)."""
    z = logits.float()
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (p * z).sum(-1)


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token], in fp32. logits (..., V), tokens (...)."""
    z = logits.float()
    return z.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "kl") -> torch.Tensor:
    """Per-token KL estimators with x = log pi, y = log pi_ref: kl (k1) x - y; abs |x - y|; mse (k2)
    0.5 (x - y)^2; low_var_kl (k3) exp(y - x) - (y - x) - 1, clamped to [-10, 10] (always >= 0)."""
    d = logp - ref_logp
    if kind == "kl":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "mse":
        return 0.5 * d.square()
    if kind == "low_var_kl":
        r = -d
        # expm1(r) - r rather than exp(r) - r - 1: exactly >= 0 in floating point (e^r - 1 > r, r representable)
        return torch.clamp(torch.expm1(r) - r, -10.0, 10.0)
    raise ValueError(f"KL estimator must be kl, abs, mse or low_var_kl, got {kind!r}")


def kl_in_reward(token_rewards: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
                 beta: float, kind: str = "kl") -> tuple[torch.Tensor, torch.Tensor]:
    """Token rewards minus beta * KL(old, ref) on masked tokens; also the masked mean KL (logged)."""
    kl = kl_penalty(old_logp, ref_logp, kind) * mask.to(old_logp.dtype)
    return token_rewards - beta * kl, masked_mean(kl, mask)
