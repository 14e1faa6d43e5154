"""The figure of a ``ragen bench learn`` measurement (curve.png): success per update, a panel per tag, then the
training signals per iteration, drawn from the measurement's curve.csv and training.csv
(``ragen.run.learn_bench`` writes them)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CURVE_PNG = "curve.png"


def draw(out: Path) -> Path:
    """curve.png of the measurement in ``out``, from its curve.csv (and training.csv when there)."""
    import pandas as pd

    from ragen.run.learn_bench import CURVE_CSV, TRAINING_CSV

    out = Path(out)
    rows = pd.read_csv(out / CURVE_CSV).to_dict("records")
    training = pd.read_csv(out / TRAINING_CSV).to_dict("records") if (out / TRAINING_CSV).is_file() else []
    return plot_curve(rows, out / CURVE_PNG, training)


def add_figure(out: Path) -> dict[str, Any]:
    """Draw the figure of the finished measurement in ``out`` and record its path in its ``learn.json``; returns
    the measurement's result with it."""
    from ragen.io import write_json
    from ragen.run.learn_bench import RESULT_JSON

    path = Path(out) / RESULT_JSON
    result = json.loads(path.read_text())
    result["plot"] = str(draw(Path(out)))
    write_json(path, result)
    return result


def _series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["iteration"], r[key]) for r in rows if r[key] == r[key]]  # NaN != NaN: not logged there
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_curve(rows: Sequence[dict[str, Any]], path: Path, training: Sequence[dict[str, Any]] = ()) -> Path:
    """Success per update, a panel per tag: the train rollouts as a line with its 95% band, the panel
    evaluations as points with their 95% intervals. With ``training``, more panels follow, three to a row: mean
    score (train rollouts and panel per tag), the policy's entropy, the critic's explained variance, the KL to the
    start, the clip fraction, the gradient norm before clipping, response tokens per turn, actions per episode,
    groups without a success signal, how often the think states its position right and the token-summed
    advantage, per iteration (iteration k is the update after k updates)."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = list(dict.fromkeys(r["tag"] for r in rows))
    signals = (("entropy", "entropy (nats/token)"), ("explained_variance", "critic explained variance"),
               ("kl_to_start", "KL to the start (nats/token)"), ("clip_fraction", "clip fraction"),
               ("grad_norm", "actor gradient norm before clipping"),
               ("tokens_per_turn", "response tokens per turn"), ("actions_per_episode", "actions per episode"),
               (("groups_all_success", "groups_no_success"), "groups: all / none succeeded"),
               ("think_position_right", "think states its position right"),
               ("advantage_token_sum", "|advantage summed over a trajectory| (mean)"))
    n = len(tags) + (1 + len(signals) if training else 0)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[n:]:
        ax.axis("off")
    for ax, tag in zip(axes, tags, strict=False):
        for split, style in (("train", "-"), ("panel", "o")):
            pts = [r for r in rows if r["tag"] == tag and r["split"] == split]
            if not pts:
                continue
            x = [r["updates"] for r in pts]
            y, lo, hi = ([r[k] for r in pts] for k in ("success", "success_lo", "success_hi"))
            if split == "train":
                ax.plot(x, y, style, label=f"train rollouts (n={pts[0]['n']})")
                ax.fill_between(x, lo, hi, alpha=0.2)
            else:
                ax.errorbar(x, y, yerr=[[a - b for a, b in zip(y, lo, strict=True)],
                                        [b - a for a, b in zip(y, hi, strict=True)]],
                            fmt=style, capsize=4, label=f"panel (n={pts[0]['n']})")
        ax.set(title=f"{tag}: success", xlabel="updates", ylabel="success rate (95% CI)", ylim=(0, 1))
        ax.legend(loc="upper left", fontsize=8)
    if training:
        score = axes[len(tags)]
        for tag in tags:
            for split, style in (("train", "-"), ("panel", "o")):
                pts = [r for r in rows if r["tag"] == tag and r["split"] == split]
                if pts:
                    score.plot([r["updates"] for r in pts], [r["score"] for r in pts], style,
                               label=f"{tag} {split}")
        score.set(title="mean score", xlabel="updates")
        score.legend(fontsize=8)
        for ax, (keys, title) in zip(axes[len(tags) + 1:], signals, strict=False):
            drawn = 0
            for key in (keys,) if isinstance(keys, str) else keys:
                if not training or key not in training[0]:  # a training.csv of an earlier version
                    continue
                x, y = _series(training, key)
                if key == "explained_variance":  # <= 1 by definition; below -1 (a critic far worse than a
                    # constant, or returns with almost no spread in runs logged before that read as undefined)
                    y = [v if v >= -1 else float("nan") for v in y]
                    ax.axhline(0.3, color="grey", ls=":", lw=1)
                    ax.set_ylim(-1, 1)
                ax.plot(x, y, ".-", label=key.replace("_", " "))
                drawn += len(x)
            if not isinstance(keys, str):
                ax.legend(fontsize=8)
            ax.set(title=title, xlabel="updates")
            if not drawn:  # e.g. GRPO has no critic; value-only iterations have no actor step
                ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
