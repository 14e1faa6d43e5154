"""Training curves as PNG files, one figure per metric family, from the per-iteration metric dicts a run writes
(``iter_*/metrics.json``; ``RunResult.metrics``). matplotlib is imported only when plotting, so ``ragen.report``
imports without it."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

# Family -> pattern over the metric names the run produces (rollout/metrics.py, run/iteration.py,
# train/update.py). Per-tag means only: ``train/<tag>/non-zero/score`` and the like would double the lines.
FAMILIES: dict[str, re.Pattern[str]] = {
    "score": re.compile(r"(train|val)/([^/]+/)?(score|reward)"),  # train/Bandit/score, val/score
    "success": re.compile(r"(train|val)/([^/]+/)?(success|pass@\d+)"),  # train/Bandit/success, val/Bandit/pass@4
    "entropy": re.compile(r"actor/entropy(_loss)?"),  # the mean token entropy is logged as actor/entropy_loss
    "grad_norm": re.compile(r"(actor|critic)/grad_norm"),
    "in_group_std": re.compile(r"rollout/(chosen_)?in_group_(reward_)?std"),  # StarPO-S's variance signal
}
_YLABEL = {"score": "score (summed reward)", "success": "success rate", "entropy": "entropy",
           "grad_norm": "gradient norm", "in_group_std": "in-group score std"}


def training_series(metrics: Mapping[int, Mapping[str, float]]) -> dict[str, tuple[list[int], dict[str, list[float]]]]:
    """Per family with any finite value: the iterations (sorted) and, per matching key, its values with NaN
    where an iteration lacks the key (val/* exists only on evaluated iterations) or holds a non-number."""
    iterations = sorted(int(k) for k in metrics)
    by_iter = {int(k): v for k, v in metrics.items()}
    keys = sorted({key for m in metrics.values() for key in m})
    out: dict[str, tuple[list[int], dict[str, list[float]]]] = {}
    for family, pattern in FAMILIES.items():
        lines: dict[str, list[float]] = {}
        for key in keys:
            if pattern.fullmatch(key):
                ys = [_float(by_iter[i].get(key)) for i in iterations]
                if any(math.isfinite(y) for y in ys):
                    lines[key] = ys
        if lines:
            out[family] = (iterations, lines)
    return out


def plot_training_curves(metrics: Mapping[int, Mapping[str, float]], out: Path) -> list[Path]:
    """Write ``out/<family>.png`` for each family present (x = iteration, one line per key); return the paths.
    NaN gaps break a line; markers keep isolated points (sparse validation) visible."""
    # The object-oriented API with an explicit Agg canvas: no pyplot, so neither the process-wide backend nor
    # pyplot's figure registry is touched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    out = Path(out)
    written: list[Path] = []
    for family, (xs, lines) in training_series(metrics).items():
        fig = Figure(figsize=(7, 4), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for key, ys in lines.items():
            # a series logged only on some iterations (val/ every test_freq) is drawn through its own points
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y == y]
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=key)
        ax.set(xlabel="iteration", ylabel=_YLABEL[family], title=family.replace("_", " "))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{family}.png"
        fig.savefig(path, format="png")
        written.append(path)
    return written


def _float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
