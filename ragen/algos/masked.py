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
