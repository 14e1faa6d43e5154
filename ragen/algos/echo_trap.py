"""Echo Trap early warnings (docs/evaluation.md) over a run's per-iteration metrics, as pure functions.

The paper's signs of collapse: the in-group reward std falls (the policy answers every member of a group alike),
the entropy changes sharply, and the gradient norm spikes. Each sign is measured against the run's own early
iterations (a baseline window), so the thresholds are ratios and work at any reward scale."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

STD = "rollout/in_group_std"
ENTROPY = "actor/entropy_loss"
GRAD = "actor/grad_norm"
REWARD = "rollout/in_group_mean"  # the batch's mean score, before the filter


def _finite(xs: Sequence[float]) -> list[float]:
    return [x for x in xs if isinstance(x, int | float) and math.isfinite(x)]


def _mean(xs: Sequence[float]) -> float:
    xs = _finite(xs)
    return math.fsum(xs) / len(xs) if xs else math.nan


def _median(xs: Sequence[float]) -> float:
    xs = sorted(_finite(xs))
    if not xs:
        return math.nan
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def echo_trap(history: Sequence[Mapping[str, float]], window: int = 3, std_collapse: float = 0.3,
              entropy_change: float = 0.5, grad_spike: float = 10.0) -> dict[str, float]:
    """Diagnostics at the last entry of ``history`` (one metrics dict per iteration, oldest first):

    * ``echo/std_ratio``: mean in-group std over the last ``window`` iterations / over the first ``window``;
      ``echo/std_collapse`` = 1 when it is below ``std_collapse`` and the mean score did not rise
      (``echo/reward_change``, recent minus baseline): every member of a group succeeding alike is convergence,
      not the Echo Trap;
    * ``echo/entropy_change``: |recent mean entropy / baseline - 1|; ``echo/entropy_shift`` = 1 above
      ``entropy_change``; ``echo/entropy_rise`` = 1 when the entropy rose by more than that (a blow-up);
    * ``echo/grad_norm_ratio``: the last grad norm / the median of all earlier ones; ``echo/grad_spike`` = 1
      above ``grad_spike``;
    * ``echo/warning`` = 1 when any sign is on. Until ``2 * window`` iterations exist only the grad-norm sign
      (which needs 3) can fire: a baseline and a recent window must not overlap."""
    out: dict[str, float] = {}
    n = len(history)
    flags = []
    if n >= 2 * window:
        base, recent = history[:window], history[-window:]
        b, r = _mean([h.get(STD, math.nan) for h in base]), _mean([h.get(STD, math.nan) for h in recent])
        ratio = r / b if b > 0 else (math.nan if math.isnan(r) or math.isnan(b) else 1.0)
        out["echo/std_ratio"] = ratio
        rb, rr = _mean([h.get(REWARD, math.nan) for h in base]), _mean([h.get(REWARD, math.nan) for h in recent])
        out["echo/reward_change"] = rr - rb
        rose = math.isfinite(rr - rb) and rr > rb
        flags.append(("echo/std_collapse", math.isfinite(ratio) and ratio < std_collapse and not rose))
        be, re = _mean([h.get(ENTROPY, math.nan) for h in base]), _mean([h.get(ENTROPY, math.nan) for h in recent])
        change = abs(re / be - 1) if be and math.isfinite(be) and math.isfinite(re) else math.nan
        out["echo/entropy_change"] = change
        flags.append(("echo/entropy_shift", math.isfinite(change) and change > entropy_change))
        # the blow-up direction alone (the policy unlearning): a falling entropy is also the healthy sharpening
        rise = re / be - 1 if be and math.isfinite(be) and math.isfinite(re) else math.nan
        flags.append(("echo/entropy_rise", math.isfinite(rise) and rise > entropy_change))
    if n >= 3:
        med = _median([h.get(GRAD, math.nan) for h in history[:-1]])
        last = history[-1].get(GRAD, math.nan)
        ratio = last / med if med and math.isfinite(med) and math.isfinite(last) else math.nan
        out["echo/grad_norm_ratio"] = ratio
        flags.append(("echo/grad_spike", math.isfinite(ratio) and ratio > grad_spike))
    for key, on in flags:
        out[key] = float(on)
    out["echo/warning"] = float(any(on for _, on in flags))
    return out


def first_warning(history: Sequence[Mapping[str, float]], **thresholds: float) -> int | None:
    """The first iteration (index into ``history``) whose diagnostics raise a warning, or None."""
    for k in range(len(history)):
        if echo_trap(history[:k + 1], **thresholds)["echo/warning"]:
            return k
    return None
