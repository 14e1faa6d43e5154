"""The ablation report's figures: per finding a bar chart of pooled success (each run's start marked) and the
training curves."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from ragen.eval.stats import wilson
from ragen.report.paper import Finding
from ragen.report.verdicts import GridResult, before, pooled


def bar_chart(f: Finding, names: list[str], results: Sequence[GridResult], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(f.tags), figsize=(max(4.0, 0.7 * len(names) + 1.5) * len(f.tags), 3.6),
                             squeeze=False)
    for ax, tag in zip(axes[0], f.tags, strict=True):
        xs = range(len(names))
        ours, err_lo, err_hi = [], [], []
        for n in names:
            p = pooled(results, n, tag)
            if p is None:
                ours.append(math.nan)
                err_lo.append(0.0)
                err_hi.append(0.0)
                continue
            rate = p[0] / p[1]
            lo, hi = wilson(p[0], p[1])
            ours.append(rate)
            err_lo.append(rate - lo)
            err_hi.append(hi - rate)
        ax.bar(xs, ours, yerr=[err_lo, err_hi], capsize=3, color="#4c72b0", label="ours (95% CI)")
        # the same panel before training: at small scale a run can end below where it started
        start = [math.nan if (b := before(results, n, tag)) is None else b for n in names]
        if any(math.isfinite(b) for b in start):
            ax.scatter(xs, start, marker="_", s=420, linewidths=2.5, color="#c44e52", zorder=4, label="before training")
        paper = [f.values.get((n, tag), math.nan) for n in names]
        ax.scatter(xs, paper, marker="D", color="#dd8452", zorder=3, label="paper")
        ax.set_xticks(list(xs), names, rotation=40, ha="right", fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_title(tag, fontsize=9)
        ax.set_ylabel("success rate")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curves_figure(f: Finding, names: list[str], results: Sequence[GridResult], path: Path) -> Path | None:
    """Validation success over iterations (mean over the finding's tags) and in-group reward std, per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results if r.experiment in names and r.history]
    if not runs:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in runs:
        xs, ys = [], []
        for k, h in enumerate([r.init, *r.history]):  # x = 0: before training; x = k + 1: after iteration k
            vals = [h[f"val/{t}/success"] for t in f.tags if f"val/{t}/success" in h]
            if vals:
                xs.append(k)
                ys.append(sum(vals) / len(vals))
        a.plot(xs, ys, marker="o", label=f"{r.experiment}-s{r.seed}")
        b.plot(range(1, len(r.history) + 1), [h.get("rollout/in_group_std", math.nan) for h in r.history])
    a.set_xlabel("iteration (0 = before training)")
    a.set_ylabel("val success (mean over tags)")
    a.set_ylim(-0.02, 1.02)
    b.set_xlabel("iteration")
    b.set_ylabel("in-group reward std")
    a.legend(fontsize=6)
    fig.suptitle(f.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
