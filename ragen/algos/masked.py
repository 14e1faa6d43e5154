"""Masked reductions shared by advantages and losses."""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() if dim is None else (x * m).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over masked entries (0 where nothing is masked in)."""
    n = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / n.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    m = mask.to(x.dtype)
    n = m.sum()
    mean = masked_mean(x, mask)
    sq = ((x - mean) ** 2 * m).sum()
    if unbiased:
        if n < 2:
            return torch.zeros((), dtype=x.dtype)
        return sq / (n - 1)
    return sq / n.clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over masked entries, unbiased variance; the mean is not added back.
    Entries outside the mask are set to 0."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps) if shift_mean else x * torch.rsqrt(var + eps)
    return out * mask.to(x.dtype)


# returns spread below this (relative to their size) carry no signal to explain: every trajectory scored alike
EV_MIN_RELATIVE_VAR = 1e-6


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over masked entries (unbiased); NaN where the returns do not vary
    (all equal up to rounding), where the ratio means nothing and would be a huge negative number."""
    if int(mask.sum()) < 2:
        return float("nan")
    r = returns.double()
    var_r = float(masked_var(r, mask))
    size = float(masked_mean(r * r, mask))
    if var_r <= EV_MIN_RELATIVE_VAR * max(size, 1e-12):
        return float("nan")
    return 1.0 - float(masked_var(r - values.double(), mask)) / var_r
