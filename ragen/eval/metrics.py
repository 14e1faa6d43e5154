"""Panel metrics per tag from a rollouts table (one group per panel seed, ``eval.pass_k`` samples each)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ragen.eval.stats import mean_interval, pass_at_k, wilson


def _rate(out: dict[str, float], key: str, hits: float, n: int) -> None:
    lo, hi = wilson(hits, n)
    out[key], out[f"{key}_lo"], out[f"{key}_hi"] = (hits / n if n else float("nan")), lo, hi


def _mean(out: dict[str, float], key: str, values: np.ndarray) -> None:
    out[key], out[f"{key}_lo"], out[f"{key}_hi"] = mean_interval([float(v) for v in values])


def panel_metrics(df: pd.DataFrame) -> dict[str, float]:
    """``{tag}/success`` (episodes, Wilson 95% CI as ``_lo``/``_hi``), ``{tag}/pass@k`` (k = samples per seed; the
    unbiased estimator averaged over seeds, Wilson CI over seeds for k = all samples), ``{tag}/reward`` and
    ``{tag}/response_length`` (means, normal CI), ``{tag}/format_error_rate`` (turns, Wilson CI), counts; and
    the same over all tags as ``all/*`` means of the per-tag values."""
    out: dict[str, float] = {}
    for tag, sub in df.groupby("tag", sort=False):
        n = len(sub)
        succ = sub["success"].astype(bool).to_numpy()
        _rate(out, f"{tag}/success", float(succ.sum()), n)
        per_seed = sub.groupby("group")["success"].agg(["size", "sum"])
        k = int(per_seed["size"].min())
        if k > 1:
            out[f"{tag}/pass@{k}"] = float(np.mean([pass_at_k(int(sz), int(c), k) for sz, c in
                                                    per_seed.itertuples(index=False)]))
            lo, hi = wilson(float((per_seed["sum"] > 0).sum()), len(per_seed))
            out[f"{tag}/pass@{k}_lo"], out[f"{tag}/pass@{k}_hi"] = lo, hi
        _mean(out, f"{tag}/reward", sub["score"].to_numpy(dtype=float))
        _mean(out, f"{tag}/response_length", sub["response_length"].to_numpy(dtype=float))
        turns = np.concatenate([np.asarray(x, dtype=bool) for x in sub["turn_format_error"]]) if n else np.zeros(0)
        _rate(out, f"{tag}/format_error_rate", float(turns.sum()), len(turns))
        out[f"{tag}/episodes"], out[f"{tag}/seeds"] = float(n), float(len(per_seed))
    tags = list(dict.fromkeys(df["tag"]))
    for m in ("success", "reward", "response_length", "format_error_rate"):
        if tags:
            out[f"all/{m}"] = float(np.mean([out[f"{t}/{m}"] for t in tags]))
    return out
