"""Runs side by side from their run directories: the kept history of each (completed iterations), what the
collapse guard rolled back (``guard/rollback-<n>/iter_*``) and where, a summary per run, and one figure with a
panel per metric (kept iterations solid, rolled-back ones dashed, rollbacks as vertical lines). Used to show the
guard saving a run that collapses without it (README, infra notes)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragen.run.guard import ARCHIVE, GuardState
from ragen.run.rundir import RunDir

KEYS = ("val/score", "actor/entropy_loss", "actor/grad_norm", "rollout/in_group_std")


def kept_history(root: Path) -> dict[int, dict[str, float]]:
    run = RunDir(Path(root))
    return {k: run.metrics(k) for k in run.completed()}


def rolled_back_history(root: Path) -> list[dict[int, dict[str, float]]]:
    """Per rollback (in order), the metrics of the iterations it archived."""
    out = []
    for n in range(1, len(GuardState.read(RunDir(Path(root))).rollbacks) + 1):
        d = Path(root) / ARCHIVE / f"rollback-{n}"
        out.append({int(p.parent.name.split("_")[1]): json.loads(p.read_text())
                    for p in sorted(d.glob("iter_*/metrics.json"))})
    return out


def _finite(xs: Sequence[Any]) -> list[float]:
    return [float(x) for x in xs if isinstance(x, int | float) and math.isfinite(x)]


def summarize(root: Path, keys: Sequence[str] = KEYS, last: int = 3) -> dict[str, Any]:
    """One run: iterations kept, rollbacks, and per key the first, last, best and the mean of the last ``last``
    kept values; plus the same keys at their worst among the rolled-back iterations."""
    hist = kept_history(root)
    state = GuardState.read(RunDir(Path(root)))
    out: dict[str, Any] = {"run": Path(root).name, "iterations": len(hist),
                           "rollbacks": [{"at": r.at, "to": r.to, "signals": r.signals, "lr_factor": r.lr_factor}
                                         for r in state.rollbacks],
                           "echo_warnings": sum(int(m.get("echo/warning", 0) or 0) for m in hist.values())}
    its = sorted(hist)
    for key in keys:
        vals = _finite([hist[k].get(key) for k in its])
        if vals:
            out[key] = {"first": vals[0], "last": vals[-1], "max": max(vals), "min": min(vals),
                        f"mean_last_{last}": sum(vals[-last:]) / len(vals[-last:])}
    gone = [m for seg in rolled_back_history(root) for m in seg.values()]
    if gone:
        out["rolled_back"] = {key: {"max": max(v), "min": min(v)} for key in keys
                              if (v := _finite([m.get(key) for m in gone]))}
    return out


def plot_compare(roots: Sequence[Path], out: Path, keys: Sequence[str] = KEYS, labels: Sequence[str] | None = None
                 ) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    labels = list(labels or [Path(r).name for r in roots])
    fig = Figure(figsize=(5 * min(len(keys), 2), 3.4 * math.ceil(len(keys) / 2)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(math.ceil(len(keys) / 2), min(len(keys), 2), squeeze=False).ravel()
    # each run's files are read once, not once per panel
    runs = [(kept_history(r), rolled_back_history(r), GuardState.read(RunDir(Path(r))).rollbacks) for r in roots]
    for ax, key in zip(axes, keys, strict=False):
        for i, ((hist, segments, rollbacks), label) in enumerate(zip(runs, labels, strict=True)):
            color = f"C{i}"
            pts = [(k, v) for k in sorted(hist) if (v := hist[k].get(key)) is not None and math.isfinite(v)]
            ax.plot([k for k, _ in pts], [v for _, v in pts], marker="o", markersize=3, color=color, label=label)
            for seg in segments:
                pts = [(k, v) for k in sorted(seg) if (v := seg[k].get(key)) is not None and math.isfinite(v)]
                ax.plot([k for k, _ in pts], [v for _, v in pts], ls="--", marker="x", markersize=3, color=color,
                        alpha=0.5)
            for r in rollbacks:
                ax.axvline(r.at + 0.5, color=color, ls=":", alpha=0.7)
        ax.set(xlabel="iteration", title=key)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small", title="dashed: rolled back; dotted: rollback", title_fontsize="x-small")
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def markdown(rows: Sequence[dict[str, Any]], keys: Sequence[str] = KEYS, last: int = 3) -> str:
    head = ["run", "iterations kept", "rollbacks", *[f"{k} (first -> mean of last {last})" for k in keys]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["run"], str(r["iterations"]),
                 ", ".join(f"at {b['at']} -> after {b['to']} ({'+'.join(b['signals'])}, lr x{b['lr_factor']:g})"
                           for b in r["rollbacks"]) or "none"]
        for k in keys:
            s = r.get(k)
            cells.append(f"{s['first']:.3g} -> {s[f'mean_last_{last}']:.3g}" if s else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
