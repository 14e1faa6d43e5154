"""The ablation report: for each paper finding, our numbers beside the paper's, with 95% CIs, the scale they
came from and a verdict per claimed ordering (reproduced / not reproduced / inconclusive at this scale), plus
bar charts, training curves and the Echo Trap warnings of every run. The markdown is made here; the
statistics are in verdicts.py, the figures in ablation_figures.py. Input: one ``GridResult`` per grid run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from ragen.algos.echo_trap import first_warning
from ragen.eval.stats import wilson
from ragen.report.ablation_figures import bar_chart, curves_figure
from ragen.report.paper import FINDINGS, Finding
from ragen.report.verdicts import (
    GridResult,
    before,
    before_after_counts,
    change_verdict,
    claim_verdict,
    finding_verdict,
    pool_counts,
    pooled,
)


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
             f"exact table entries or, for figures, approximate readings of the curves' ends. A "
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
        png = bar_chart(f, names, results, fig_dir / f"{f.key}.png")
        curves = curves_figure(f, names, results, fig_dir / f"{f.key}-curves.png")
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


def training_effect(results: Sequence[GridResult]) -> list[str]:
    """The report section on what training did to each run: its panel success before vs after, per tag and,
    for runs scored on several tags, pooled over them (4x the episodes, so smaller shifts show)."""
    rows, counts, pooled_counts = [], {"up": 0, "down": 0, "no change": 0}, {"up": 0, "down": 0, "no change": 0}
    for r in results:
        per_tag = {t: ba for t in sorted({k.split("/")[0] for k in r.eval if k.endswith("/success")})
                   if (ba := before_after_counts(r, t)) is not None}
        for tag, ba in per_tag.items():
            c = change_verdict(ba)
            counts[c[0]] += 1
            rows.append(f"| {r.experiment}-s{r.seed} | {tag} | {_pct(r.init[f'val/{tag}/success'])} | "
                        f"{_pct(r.eval[f'{tag}/success'])} | {_diff(*c[1:])} | {c[0]} |")
        if len(per_tag) > 1:
            k_after, n_after, k_before, n_before = pooled = pool_counts(list(per_tag.values()))
            c = change_verdict(pooled)
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
