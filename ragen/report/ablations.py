"""The ablation report: for each paper finding, our numbers beside the paper's, with 95% CIs, the scale they
came from and a verdict per claimed ordering (reproduced / not reproduced / inconclusive at this scale), plus
bar charts, training curves and the Echo Trap warnings of every run. Input: one ``GridResult`` per grid run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ragen.algos.echo_trap import first_warning
from ragen.eval.stats import rate_difference, wilson
from ragen.report.paper import FINDINGS, Finding


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
    return ("inconclusive", "reproduced", "not reproduced")[_sign(lo, hi)], d, lo, hi


def _sign(lo: float, hi: float) -> int:
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


def _pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _cell(p: tuple[float, int] | None) -> str:
    if p is None:
        return "-"
    lo, hi = wilson(p[0], p[1])
    return f"{_pct(p[0] / p[1])} [{_pct(lo)}, {_pct(hi)}] (n={p[1]})"


def experiments_of(f: Finding) -> list[str]:
    names = list(dict.fromkeys([e for e, _ in f.values] + [x for c in f.claims for x in c[:2]]))
    from ragen.experiments import EXPERIMENTS

    names += [n for n, e in EXPERIMENTS.items() if e.finding == f.key and n not in names]
    order = {n: i for i, n in enumerate(EXPERIMENTS)}  # the registry's order: online-1, 2, 5, 10; granularity 1..7
    return sorted(names, key=lambda n: order.get(n, len(order)))


def write_report(results: Sequence[GridResult], scale: str, out: str | Path, *, title: str = "Ablations",
                 notes: Sequence[str] = ()) -> Path:
    """``out`` (a .md path) plus ``<stem>/*.png`` beside it; returns the markdown path."""
    out = Path(out)
    fig_dir = out.with_suffix("")
    fig_dir.mkdir(parents=True, exist_ok=True)
    ran = {r.experiment for r in results}
    seeds = sorted({r.seed for r in results})
    intro = [f"# {title}", "",
             f"Scale **{scale}**; {len(results)} runs ({len(ran)} experiments x seeds {seeds}). Success rates in %"
             f" on the fixed evaluation panel after the last iteration (\"x before\": the same panel before "
             f"training), 95% Wilson intervals, episodes pooled over seeds. Paper values are "
             f"exact table entries or, for figures, approximate readings of the curves' ends (REFERENCE 6). A "
             f"claim is *reproduced* when our difference has the paper's sign at 95% (its Newcombe interval "
             f"excludes 0), "
             f"*not reproduced* when it has the opposite sign at 95%, else *inconclusive at this scale*.", "",
             *notes, ""]
    lines: list[str] = []
    summary = []
    for f in FINDINGS.values():
        names = [n for n in experiments_of(f) if n in ran]
        if not names:
            summary.append((f, "not run"))
            continue
        lines += [f"## {f.title}", "", f"Paper: {f.statement}", ""]
        if f.note:
            lines += [f"Note: {f.note}", ""]
        header = "| experiment | " + " | ".join(f"{t} ours | {t} paper" for t in f.tags) + " |"
        lines += [header, "|" + "---|" * (1 + 2 * len(f.tags))]
        for n in names:
            cells = []
            for t in f.tags:
                b = before(results, n, t)
                ours = _cell(pooled(results, n, t)) + (f"; {_pct(b)} before" if b is not None else "")
                cells += [ours, _pct(f.values[(n, t)]) if (n, t) in f.values else "-"]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines += ["", "| claim | tag | difference (pp) [95% CI] | verdict |", "|---|---|---|---|"]
        verdicts = []
        for better, worse, tag in f.claims:
            v, d, lo, hi = claim_verdict(pooled(results, better, tag), pooled(results, worse, tag))
            verdicts.append(v)
            lines.append(f"| {better} > {worse} | {tag} | {_diff(d, lo, hi)} | {v} |")
        fv = finding_verdict(verdicts)
        tested = sum(v != "not run" for v in verdicts)
        if 0 < tested < len(verdicts):  # a verdict on part of the finding says so
            fv += f" ({tested} of {len(verdicts)} claims run)"
        summary.append((f, fv))
        lines += ["", f"**Verdict at {scale}: {fv}.**", ""]
        png = _bar_chart(f, names, results, fig_dir / f"{f.key}.png")
        curves = _curves(f, names, results, fig_dir / f"{f.key}-curves.png")
        lines += [f"![{f.key}]({fig_dir.name}/{png.name})", ""]
        if curves is not None:
            lines += [f"![{f.key} curves]({fig_dir.name}/{curves.name})", ""]
    lines += training_effect(results)
    lines += ["## Echo Trap diagnostics", "",
              "Per run: the first iteration with an early warning (in-group reward std collapse, entropy shift or "
              "grad-norm spike, thresholds in `diagnostics.*`), and the final std ratio and grad-norm ratio.", "",
              "| run | iterations | first warning | std ratio | grad-norm ratio | entropy change |",
              "|---|---|---|---|---|---|"]
    for r in results:
        last = r.history[-1] if r.history else {}
        fw = first_warning(r.history) if r.history else None
        lines.append(f"| {r.experiment}-s{r.seed} | {len(r.history)} | {'-' if fw is None else fw} | "
                     f"{_num(last.get('echo/std_ratio'))} | {_num(last.get('echo/grad_norm_ratio'))} | "
                     f"{_num(last.get('echo/entropy_change'))} |")
    head = ["## Summary", "", "| finding | verdict |", "|---|---|", *[f"| {f.title} | {v} |" for f, v in summary], ""]
    out.write_text("\n".join(intro + head + lines) + "\n")
    return out


def _before_after(r: GridResult, tag: str) -> tuple[int, int, int, int] | None:
    """Successes and episodes on ``tag`` after and before training (None without both evaluations)."""
    k_after, k_before = r.eval.get(f"{tag}/episodes"), r.init.get(f"val/{tag}/episodes")
    if not k_after or not k_before or f"{tag}/success" not in r.eval or f"val/{tag}/success" not in r.init:
        return None
    return (round(r.eval[f"{tag}/success"] * k_after), int(k_after),
            round(r.init[f"val/{tag}/success"] * k_before), int(k_before))


def _change(counts: tuple[int, int, int, int]) -> tuple[str, float, float, float]:
    d, lo, hi = rate_difference(*counts)
    return ("no change", "up", "down")[_sign(lo, hi)], d, lo, hi


def training_change(r: GridResult, tag: str | Sequence[str]) -> tuple[str, float, float, float] | None:
    """``up`` / ``down`` when the run's final success on ``tag`` differs from its own before-training score on
    the same panel at 95% (Newcombe interval; it ignores that the seeds are paired, which makes it conservative
    when outcomes correlate), else ``no change``; plus the difference and its interval. Several tags are pooled
    (episodes summed over those with both evaluations). None without both evaluations."""
    tags = [tag] if isinstance(tag, str) else list(tag)
    parts = [c for c in (_before_after(r, t) for t in tags) if c is not None]
    return _change(_pooled(parts)) if parts else None


def _pooled(parts: Sequence[tuple[int, int, int, int]]) -> tuple[int, int, int, int]:
    """Several tags' (successes after, episodes after, successes before, episodes before), summed."""
    return tuple(sum(c[i] for c in parts) for i in range(4))  # type: ignore[return-value]


def training_effect(results: Sequence[GridResult]) -> list[str]:
    """The report section on what training did to each run: its panel success before vs after, per tag and,
    for runs scored on several tags, pooled over them (4x the episodes, so smaller shifts show)."""
    rows, counts, pooled_counts = [], {"up": 0, "down": 0, "no change": 0}, {"up": 0, "down": 0, "no change": 0}
    for r in results:
        per_tag = {t: ba for t in sorted({k.split("/")[0] for k in r.eval if k.endswith("/success")})
                   if (ba := _before_after(r, t)) is not None}
        for tag, ba in per_tag.items():
            c = _change(ba)
            counts[c[0]] += 1
            rows.append(f"| {r.experiment}-s{r.seed} | {tag} | {_pct(r.init[f'val/{tag}/success'])} | "
                        f"{_pct(r.eval[f'{tag}/success'])} | {_diff(*c[1:])} | {c[0]} |")
        if len(per_tag) > 1:
            k_after, n_after, k_before, n_before = pooled = _pooled(list(per_tag.values()))
            c = _change(pooled)
            pooled_counts[c[0]] += 1
            rows.append(f"| {r.experiment}-s{r.seed} | **all {len(per_tag)} tags** | {_pct(k_before / n_before)} | "
                        f"{_pct(k_after / n_after)} | {_diff(*c[1:])} | **{c[0]}** |")
    if not rows:
        return []
    n_tag, n_pool = sum(counts.values()), sum(pooled_counts.values())
    runs = f"{n_pool} run{'s' if n_pool != 1 else ''}"
    pooled_line = (f" Pooled over each multi-tag run's tags ({runs}): {pooled_counts['up']} up, "
                   f"{pooled_counts['down']} down, {pooled_counts['no change']} without a significant change."
                   if n_pool else "")
    return ["## What training changed", "",
            "Each run's final panel success against its own score on the same panel before training "
            "(95% Newcombe interval of the difference). "
            f"Of {n_tag} run x tag pairs: {counts['up']} up, {counts['down']} down, {counts['no change']} "
            f"without a significant change.{pooled_line}", "",
            "| run | tag | before | after | difference (pp) [95% CI] | change |", "|---|---|---|---|---|---|",
            *rows, ""]


def _diff(d: float, lo: float, hi: float) -> str:
    return "-" if math.isnan(d) else f"{_pct(d)} [{_pct(lo)}, {_pct(hi)}]"


def _num(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.3g}"


def _bar_chart(f: Finding, names: list[str], results: Sequence[GridResult], path: Path) -> Path:
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


def _curves(f: Finding, names: list[str], results: Sequence[GridResult], path: Path) -> Path | None:
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
