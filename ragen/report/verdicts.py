"""The ablation report's statistics: pooled success per experiment and tag, a verdict per claimed ordering (the
95% Newcombe interval of the difference) and what training changed against each run's own start."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ragen.eval.stats import rate_difference


@dataclass
class GridResult:
    experiment: str
    seed: int
    eval: Mapping[str, float]  # ragen.eval.metrics.panel_metrics of the final checkpoint
    history: Sequence[Mapping[str, float]] = field(default_factory=list)  # metrics.json per iteration
    init: Mapping[str, float] = field(default_factory=dict)  # the evaluation before training (val/<tag>/...)


def before(results: Sequence[GridResult], experiment: str, tag: str) -> float | None:
    """Mean success on ``tag`` before training over the experiment's seeds (None: no such evaluation)."""
    xs = [r.init[f"val/{tag}/success"] for r in results if r.experiment == experiment
          and f"val/{tag}/success" in r.init]
    return sum(xs) / len(xs) if xs else None


def pooled(results: Sequence[GridResult], experiment: str, tag: str) -> tuple[float, int] | None:
    """Successes and episodes of ``tag`` over every seed of ``experiment`` (None: not run or not scored there)."""
    hits, n = 0.0, 0
    for r in results:
        if r.experiment == experiment and f"{tag}/success" in r.eval:
            k = int(r.eval[f"{tag}/episodes"])
            hits += r.eval[f"{tag}/success"] * k
            n += k
    return (round(hits), n) if n else None


def claim_verdict(better: tuple[float, int] | None, worse: tuple[float, int] | None
                  ) -> tuple[str, float, float, float]:
    """``reproduced`` when ours is significantly higher as claimed (the 95% interval of the difference is above
    0), ``not reproduced`` when significantly lower, else ``inconclusive``; ``not run`` without both; plus the
    difference and its interval."""
    if better is None or worse is None:
        return "not run", math.nan, math.nan, math.nan
    d, lo, hi = rate_difference(better[0], better[1], worse[0], worse[1])
    return ("inconclusive", "reproduced", "not reproduced")[interval_sign(lo, hi)], d, lo, hi


def interval_sign(lo: float, hi: float) -> int:
    """1 when a difference's interval is above 0, -1 when below, 0 when it straddles 0."""
    return 1 if lo > 0 else -1 if hi < 0 else 0


def finding_verdict(verdicts: Sequence[str]) -> str:
    run = [v for v in verdicts if v != "not run"]
    if not run:
        return "not run"
    if all(v == "reproduced" for v in run):
        return "reproduced"
    if all(v == "not reproduced" for v in run):
        return "not reproduced"
    if any(v == "reproduced" for v in run) and any(v == "not reproduced" for v in run):
        return "mixed"
    return "inconclusive at this scale"


def before_after_counts(r: GridResult, tag: str) -> tuple[int, int, int, int] | None:
    """Successes and episodes on ``tag`` after and before training (None without both evaluations)."""
    k_after, k_before = r.eval.get(f"{tag}/episodes"), r.init.get(f"val/{tag}/episodes")
    if not k_after or not k_before or f"{tag}/success" not in r.eval or f"val/{tag}/success" not in r.init:
        return None
    return (round(r.eval[f"{tag}/success"] * k_after), int(k_after),
            round(r.init[f"val/{tag}/success"] * k_before), int(k_before))


def change_verdict(counts: tuple[int, int, int, int]) -> tuple[str, float, float, float]:
    d, lo, hi = rate_difference(*counts)
    return ("no change", "up", "down")[interval_sign(lo, hi)], d, lo, hi


def training_change(r: GridResult, tag: str | Sequence[str]) -> tuple[str, float, float, float] | None:
    """``up`` / ``down`` when the run's final success on ``tag`` differs from its own before-training score on
    the same panel at 95% (Newcombe interval; it ignores that the seeds are paired, which makes it conservative
    when outcomes correlate), else ``no change``; plus the difference and its interval. Several tags are pooled
    (episodes summed over those with both evaluations). None without both evaluations."""
    tags = [tag] if isinstance(tag, str) else list(tag)
    parts = [c for c in (before_after_counts(r, t) for t in tags) if c is not None]
    return change_verdict(pool_counts(parts)) if parts else None


def pool_counts(parts: Sequence[tuple[int, int, int, int]]) -> tuple[int, int, int, int]:
    """Several tags' (successes after, episodes after, successes before, episodes before), summed."""
    return tuple(sum(c[i] for c in parts) for i in range(4))  # type: ignore[return-value]
