"""``ragen bench learn``: learning measured as a benchmark, not a test. A fresh run (the plain loop: real rollout
engine and DeepSpeed, no orchestrator) trains for a number of iterations while a fixed seed panel is scored before
training, at every ``trainer.test_freq`` and after the last iteration. The result is one JSON object: per panel
tag the success rate before and after with 95% Wilson intervals, their difference with its 95% Newcombe interval,
the same difference paired by panel seed (bootstrap interval, McNemar's test at one sample per seed, and the
panel's power for +10 pp) and the format-error rates; wall time, seconds per iteration and the update's share of
them; and the settings that produced it. The learning curve (train and panel success and score per update) and
the training signals per iteration (score of the updated trajectories, entropy, critic explained variance, KL to
the start, clip fraction) are written as CSV beside it; ``ragen.report.learning_curve`` draws them in one
figure."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ragen.config import Config, load_config
from ragen.eval.evaluate import ROLLOUTS
from ragen.eval.metrics import panel_metrics
from ragen.eval.panels import VAL_SEED, Panel, make_panel, read_panel, write_panel
from ragen.eval.stats import mcnemar_exact, paired_bootstrap, paired_power, rate_difference, wilson
from ragen.io import write_json
from ragen.run.iteration import EVAL_INIT, panel_eval_dir
from ragen.run.progress import iteration_line
from ragen.run.rundir import RunDir
from ragen.tables import write_csv

RESULT_JSON = "learn.json"
CURVE_CSV = "curve.csv"
TRAINING_CSV = "training.csv"
PANEL_JSON = "panel.json"
SPEC_JSON = "spec.json"  # the measurement's settings, for --resume
RUN_NAME = "run"
DEFAULT_PANEL_SIZE = 128  # seeds per tag: a 95% interval of about +-8 pp at a 30% rate
CURVE_FIELDS = ("updates", "split", "tag", "n", "success", "success_lo", "success_hi", "score", "format_error_rate")
# training.csv column -> the run's metric (NaN where an iteration did not log it: value-only warm-up iterations take
# no actor step; the explained variance is undefined where every return is the same)
TRAINING_METRICS = {"score": "critic/score/mean", "entropy": "actor/entropy_loss",
                    "explained_variance": "critic/vf_explained_var", "kl_to_start": "rollout/kl_old_ref",
                    "clip_fraction": "actor/pg_clipfrac", "ppo_kl": "actor/ppo_kl",
                    "zero_variance_groups": "actor/zero_variance_groups",
                    # what to watch beside success (issue 39): rollouts of the iteration, then its update
                    "tokens_per_turn": "rollout/tokens_per_turn", "actions_per_episode": "rollout/actions_per_episode",
                    "groups_all_success": "rollout/groups_all_success",
                    "groups_no_success": "rollout/groups_no_success",
                    "think_position_right": "rollout/think_position_right",
                    "advantage_mean": "critic/advantages/mean", "advantage_std": "critic/advantages/std",
                    "advantage_token_sum": "critic/advantages/token_sum_abs_mean",
                    "grad_norm": "actor/grad_norm", "seconds": "timing_s/iteration"}
TRAINING_FIELDS = ("iteration", *TRAINING_METRICS)
# --quick: a smoke run of a few minutes on the real model (4 groups x 4 rollouts, 2 iterations, 16-seed panel)
QUICK = ("envs.train.n_groups=[4]", "envs.train.group_size=4", "actor.ppo_mini_batch_size=4",
         "critic.ppo_mini_batch_size=4", "trainer.test_freq=1")
QUICK_ITERATIONS = 2
QUICK_PANEL_SIZE = 16


@dataclass(frozen=True)
class LearnSpec:
    """What to train and score: the config sources, iterations, the panel (a file, or seeds per tag) and where
    the run and the results go."""

    params: str | None = None
    presets: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    iterations: int | None = None  # None: the config's trainer.total_training_steps
    panel: str | None = None  # a panel file; None: made with panel_size seeds for each of ``tags``
    panel_size: int = DEFAULT_PANEL_SIZE
    tags: tuple[str, ...] | None = None  # panel tags; None: the config's eval.tags, else envs.val.tags
    out: str = "bench-learn"
    quick: bool = False
    keep_checkpoints: bool = False
    experiment: str | None = None  # recorded in the result (the caller resolved it into presets/overrides)


def learn_config(spec: LearnSpec, out: Path) -> tuple[Config, Path]:
    """The run's config (the spec's sources, --quick, the iterations, a fresh run directory under ``out`` and the
    panel written there) and the panel file it scores."""
    quick = list(QUICK) if spec.quick else []
    iterations = spec.iterations if spec.iterations is not None else (QUICK_ITERATIONS if spec.quick else None)
    base = load_config(spec.params, spec.presets, [*quick, *spec.overrides])  # bad settings fail here, early
    if spec.panel is not None:
        panel = read_panel(spec.panel, known_tags=list(base.tag_specs()))
        if spec.tags:
            panel = panel.select(list(spec.tags))
    else:
        tags = list(spec.tags or base.eval.tags or base.envs.val.tags)
        size = QUICK_PANEL_SIZE if spec.quick and spec.panel_size == DEFAULT_PANEL_SIZE else spec.panel_size
        panel = make_panel(f"bench-{size}", tags, size, base_seed=VAL_SEED)
        unknown = [t for t in tags if t not in base.tag_specs()]
        if unknown:
            raise ValueError(f"--tag: unknown env tag(s) {unknown}; known: {', '.join(sorted(base.tag_specs()))}")
    panel_path = write_panel(panel, out / PANEL_JSON)
    run_overrides = [f"trainer.run_dir={out}", f"eval.panel={panel_path}", f"eval.tags={json.dumps(panel.tags)}",
                     "trainer.val_before_train=true"]
    if iterations is not None:
        run_overrides.append(f"trainer.total_training_steps={iterations}")
    cfg = load_config(spec.params, spec.presets, [*quick, *spec.overrides, *run_overrides])
    check_panel_unseen(cfg, panel)
    return cfg, panel_path


def panel_seeds_trained(cfg: Config, panel: Panel) -> dict[str, int]:
    """Per panel tag, how many of its seeds the run's training iterations reset an env with."""
    from ragen.envs.instances import planned_train_seeds

    e = cfg.envs
    trained = planned_train_seeds(e.train.tags, e.train.n_groups, seed=e.train_seed,
                                  iterations=cfg.trainer.total_training_steps, seed_cycle=e.train_seeds)
    return {tag: len(set(seeds) & trained.get(tag, set())) for tag, seeds in panel.seeds.items()}


def check_panel_unseen(cfg: Config, panel: Panel) -> None:
    """No panel seed is trained on: a learning claim is about rooms the policy never practised. A positive
    control trains on a fixed list (``envs.train_seeds``) and scores those very seeds on purpose: allowed there."""
    seen = {t: n for t, n in panel_seeds_trained(cfg, panel).items() if n}
    if seen and not cfg.envs.train_seeds:
        raise ValueError(f"the panel's seeds are trained on: {', '.join(f'{t} {n}' for t, n in seen.items())} "
                         f"seed(s) within the training iterations' range; start the panel elsewhere (--panel of "
                         f"other seeds) or move envs.train_seed")


def tag_change(before: pd.DataFrame, after: pd.DataFrame, tag: str) -> dict[str, Any]:
    """One tag's success before and after (Wilson 95%), the difference (Newcombe 95%, as if the two were separate
    samples), the same difference paired by panel seed (``paired_change``) and format-error rates."""
    b, a = before[before["tag"] == tag], after[after["tag"] == tag]
    hb, ha = int(b["success"].astype(bool).sum()), int(a["success"].astype(bool).sum())
    nb, na = len(b), len(a)
    mb, ma = panel_metrics(b), panel_metrics(a)
    d, lo, hi = rate_difference(ha, na, hb, nb)
    return {"n": na, "n_before": nb, "before": hb / nb, "before_ci": list(wilson(hb, nb)), "after": ha / na,
            "after_ci": list(wilson(ha, na)), "diff": d, "diff_ci": [lo, hi], **paired_change(b, a),
            "format_errors_before": mb[f"{tag}/format_error_rate"],
            "format_errors_after": ma[f"{tag}/format_error_rate"],
            "score_before": mb[f"{tag}/reward"], "score_after": ma[f"{tag}/reward"]}


def paired_change(before: pd.DataFrame, after: pd.DataFrame) -> dict[str, Any]:
    """The same panel seeds before and after: per seed, its success rate over its samples after minus before.
    ``paired_diff`` is their mean with a 95% paired bootstrap interval over seeds (``paired_diff_ci``); with one
    sample per seed also the exact McNemar p-value over the seeds that changed (``mcnemar_p``, ``gained`` and
    ``lost``). ``power_10pp``: the chance this panel finds a true +10 pp at 95% (normal approximation with the
    spread of the per-seed differences measured here; where no seed changed, the spread two independent draws at
    the baseline would have)."""
    import numpy as np

    rate_b = before.groupby("seed")["success"].mean()
    rate_a = after.groupby("seed")["success"].mean()
    seeds = rate_b.index.intersection(rate_a.index)
    if len(seeds) < len(rate_b.index.union(rate_a.index)):
        raise ValueError(f"the panel before and after training holds different seeds ({len(rate_b)} and "
                         f"{len(rate_a)}, {len(seeds)} in common): the paired comparison needs the same panel")
    diffs = (rate_a[seeds] - rate_b[seeds]).to_numpy(dtype=np.float64)
    k = int(min(before.groupby("seed").size().min(), after.groupby("seed").size().min()))
    mean, lo, hi = paired_bootstrap(diffs)
    sd = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else 0.0
    if sd == 0:
        p = min(float(rate_b.mean()) + 0.05, 1.0)
        sd = float(np.sqrt(2 * p * (1 - p) / k))
    out: dict[str, Any] = {"paired_n": len(seeds), "samples_per_seed": k, "paired_diff": mean,
                           "paired_diff_ci": [lo, hi], "power_10pp": paired_power(sd, len(seeds))}
    if k == 1:
        gained, lost = int((diffs > 0).sum()), int((diffs < 0).sum())
        out.update({"gained": gained, "lost": lost, "mcnemar_p": mcnemar_exact(gained, lost)})
    return out


def _frame_rows(df: pd.DataFrame, updates: int, split: str) -> list[dict[str, Any]]:
    rows = []
    for tag, sub in df.groupby("tag", sort=False):
        m = panel_metrics(sub)
        rows.append({"updates": updates, "split": split, "tag": tag, "n": len(sub), "success": m[f"{tag}/success"],
                     "success_lo": m[f"{tag}/success_lo"], "success_hi": m[f"{tag}/success_hi"],
                     "score": m[f"{tag}/reward"], "format_error_rate": m[f"{tag}/format_error_rate"]})
    return rows


def panel_rollouts(run: RunDir, k: int | None) -> Path:
    """The panel evaluation's rollouts table after iteration ``k`` (None: before training)."""
    return panel_eval_dir(run.root / EVAL_INIT if k is None else run.iteration(k) / "eval.json") / ROLLOUTS


def curve_rows(run: RunDir) -> list[dict[str, Any]]:
    """Per update count: the train rollouts sampled after that many updates (split ``train``) and every panel
    evaluation (split ``panel``): before training at 0 updates, after iteration k at k + 1."""
    from ragen.rollout.table import read_rollouts

    rows = []
    if panel_rollouts(run, None).is_file():
        rows += _frame_rows(read_rollouts(panel_rollouts(run, None)), 0, "panel")
    for k in run.completed():
        train = run.iteration(k) / "rollouts.parquet"  # as ragen.run.iteration.collect_rollouts writes it
        if train.is_file():
            rows += _frame_rows(read_rollouts(train), k, "train")
        if panel_rollouts(run, k).is_file():
            rows += _frame_rows(read_rollouts(panel_rollouts(run, k)), k + 1, "panel")
    return sorted(rows, key=lambda r: (r["updates"], r["split"] != "train"))


def training_rows(run: RunDir) -> list[dict[str, Any]]:
    """Per completed iteration, the training signals of ``TRAINING_METRICS`` (NaN where not logged)."""
    rows = []
    for k in run.completed():
        m = run.metrics(k)
        rows.append({"iteration": k, **{name: float(m.get(key, float("nan")))
                                        for name, key in TRAINING_METRICS.items()}})
    return rows


def write_report_files(run: RunDir, out: Path) -> dict[str, str]:
    """curve.csv and training.csv from the run directory (so an older run's files can be rewritten); the figure
    of them is ``ragen.report.learning_curve``'s (the command draws it)."""
    rows, training = curve_rows(run), training_rows(run)
    write_csv(rows, CURVE_FIELDS, out / CURVE_CSV)
    write_csv(training, TRAINING_FIELDS, out / TRAINING_CSV)
    return {"curve": str(out / CURVE_CSV), "training": str(out / TRAINING_CSV)}


def redraw(out: Path) -> dict[str, Any]:
    """Rewrite a finished measurement's CSVs from its run directory and add their paths to its ``learn.json``
    (the before/after numbers are left as they are)."""
    path = Path(out) / RESULT_JSON
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: --redraw takes the --out directory of a finished "
                                f"`ragen bench learn`")
    result = json.loads(path.read_text())
    result.update(write_report_files(RunDir.at(Path(out), RUN_NAME), Path(out)))
    write_json(path, result)
    return result


def timing(run: RunDir) -> dict[str, float]:
    """Mean seconds per iteration (rollout, update, sync, save and any evaluation in it) and the update's share."""
    hist = [run.metrics(k) for k in run.completed()]
    total = sum(m.get("timing_s/iteration", 0.0) for m in hist)
    update = sum(m.get("timing_s/step", 0.0) for m in hist)
    rollout = sum(m.get("timing_s/rollout", 0.0) for m in hist)
    return {"s_per_iteration": total / len(hist) if hist else float("nan"),
            "update_share": update / total if total else float("nan"),
            "rollout_share": rollout / total if total else float("nan")}


def config_summary(cfg: Config, spec: LearnSpec, panel: Path) -> dict[str, Any]:
    """The settings a reader needs to compare two results (the whole config is in the run's config.yaml)."""
    from ragen.models.precision import precision_tags

    a, e = cfg.algorithm, cfg.envs.train
    return {"experiment": spec.experiment, "params": spec.params, "presets": list(spec.presets),
            "overrides": list(spec.overrides), "quick": spec.quick, "model": cfg.model.base,
            "engine": cfg.rollout.engine, **precision_tags(cfg), "train_tags": list(e.tags),
            "n_groups": list(e.n_groups), "group_size": e.group_size, "max_turn": cfg.agent.max_turn,
            "enable_think": cfg.agent.enable_think, "adv_estimator": a.adv_estimator, "filter_ratio": a.filter_ratio,
            "actor_lr": cfg.actor.lr, "critic_lr": cfg.critic.lr, "guard": cfg.guard.enabled,
            "seed": cfg.trainer.seed, "test_freq": cfg.trainer.test_freq, "panel": str(panel),
            "panel_seeds_trained": panel_seeds_trained(cfg, read_panel(panel)),
            "val_temperature": cfg.rollout.val_temperature}


def _progress(k: int, m: dict[str, float], last: int, t0: float) -> None:
    """One line per iteration on stderr: a 20-minute run shows where it is (stdout stays one JSON line)."""
    print(f"{iteration_line(k, m, last)}, {time.monotonic() - t0:.0f} s in all", file=sys.stderr, flush=True)


def saved_spec(out: str | Path) -> LearnSpec:
    """The settings an unfinished measurement in ``out`` started with (``--resume``)."""
    path = Path(out) / SPEC_JSON
    if not path.is_file():
        raise FileNotFoundError(f"{out} holds no measurement to resume (no {SPEC_JSON}); start one with --out")
    raw = json.loads(path.read_text())
    for key in ("presets", "overrides", "tags"):
        if raw.get(key) is not None:
            raw[key] = tuple(raw[key])
    return LearnSpec(**raw)


def bench_learn(spec: LearnSpec, *, log: Callable[[int, dict[str, float], int, float], None] | None = _progress,
                resume: bool = False) -> dict[str, Any]:
    """Train a fresh run under ``spec.out`` and return the before/after JSON (also written to ``learn.json``,
    with ``curve.csv`` and ``training.csv`` beside it). A finished measurement there is refused; an
    unfinished one (stopped or killed) is refused unless ``resume``, which continues it after its last completed
    iteration with the settings it started with (``saved_spec``), ending as if never stopped."""
    from dataclasses import asdict

    from ragen.run.loop import run_training

    out = Path(spec.out)
    if (out / RESULT_JSON).exists():
        raise FileExistsError(f"{out} holds a finished learning measurement; give a new --out")
    started = RunDir.at(out, RUN_NAME).completed()
    if started and not resume:
        raise FileExistsError(f"{out} already holds a learning run ({len(started)} iterations done); give a new "
                              f"--out, or --resume to continue it")
    if resume:
        spec = saved_spec(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / SPEC_JSON, asdict(spec))
    cfg, panel = learn_config(spec, out)
    last = cfg.trainer.total_training_steps - 1
    from ragen.sft.pipeline import ensure_warm_start, needs_build

    build_s = 0.0
    if needs_build(cfg):  # made before the clock starts: the measurement times RL from the warm-start, not SFT
        print(f"model.warm_start=auto: making the SFT warm-start at {cfg.sft.output} first (not part of wall_s)",
              file=sys.stderr, flush=True)
        tb = time.monotonic()
        ensure_warm_start(cfg)
        build_s = time.monotonic() - tb
    t0 = time.monotonic()
    res = run_training(cfg, RUN_NAME, on_iteration=(lambda k, m: log(k, m, last, t0)) if log else None)
    wall = time.monotonic() - t0  # this invocation's; the iterations' own times add up across resumes
    run = res.run
    done = run.completed()
    if not done or done[-1] != last:
        raise RuntimeError(f"the run in {run.root} ended at iteration {done[-1] if done else None}, not {last}")
    from ragen.rollout.table import read_rollouts

    before, after = read_rollouts(panel_rollouts(run, None)), read_rollouts(panel_rollouts(run, last))
    tags = list(dict.fromkeys(after["tag"]))
    result: dict[str, Any] = {
        "tags": {t: tag_change(before, after, t) for t in tags}, "wall_s": wall, "warm_start_build_s": build_s,
        "iterations": len(done), "resumed_at": started[-1] + 1 if started else None,
        "iterations_s": sum(run.metrics(k).get("timing_s/iteration", 0.0) for k in done),
        **timing(run), "rollbacks": len(res.rollbacks), "config": config_summary(cfg, spec, panel),
        "run_dir": str(run.root), **write_report_files(run, out)}
    write_json(out / RESULT_JSON, result)
    if not spec.keep_checkpoints:  # ~3.2 GB a state with the optimizer; the result is the panel scores, not weights
        shutil.rmtree(run.root / "checkpoints", ignore_errors=True)
    return result
