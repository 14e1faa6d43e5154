"""Weight sync into the running engine, and the sync gate that proves it took.

The gate scores a fixed probe batch with the engine and with the trainer's model; the mean and max absolute
logprob gaps must stay within tolerances. Measured on SmolLM2-135M (205 probe tokens): a bf16 vLLM engine against
the fp32 trainer is 0.058-0.082 apart on average (max 0.33-0.50), and even HF in bf16 is 0.075 from vLLM bf16, so
bf16 rounding bounds what a gate can see. A sync that failed (fp32 tensors not taken, weights garbled) measured
0.67 mean / 3.4 max, far outside the defaults (0.15 / 2.5); a small real update (0.1% weight noise) is inside
them. With an fp32 engine (``model.dtype=fp32``) the gap is ~1e-5 and tolerances can be tight (the tests use
0.01 / 0.05)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ragen.rollout.engine import Engine
from ragen.rollout.hf_engine import sequence_logprobs


class SyncGateError(RuntimeError):
    """The engine's logprobs do not match the trainer's after a weight sync."""


@dataclass(frozen=True)
class GateReport:
    mean_abs: float
    max_abs: float
    n_tokens: int
    mean_tol: float
    max_tol: float
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.mean_abs <= self.mean_tol and self.max_abs <= self.max_tol

    def metrics(self, prefix: str = "sync/") -> dict[str, float]:
        return {f"{prefix}logprob_gap_mean": self.mean_abs, f"{prefix}logprob_gap_max": self.max_abs,
                f"{prefix}seconds": self.seconds}


def logprob_gap(engine_lp: Sequence[Sequence[float]],
                trainer_lp: Sequence[Sequence[float]]) -> tuple[float, float, int]:
    """Mean and max absolute difference over all probe tokens; a non-finite value counts as an infinite gap."""
    gaps = []
    for e, t in zip(engine_lp, trainer_lp, strict=True):
        if len(e) != len(t):
            raise ValueError(f"probe sequence scored with {len(e)} engine vs {len(t)} trainer logprobs")
        gaps.extend(abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf
                    for a, b in zip(e, t, strict=True))
    if not gaps:
        raise ValueError("the probe batch has no scored tokens")
    return sum(gaps) / len(gaps), max(gaps), len(gaps)


def check_gate(engine: Engine, trainer_model: Any, probe: Sequence[Sequence[int]], *, pad_token_id: int,
               mean_tol: float, max_tol: float) -> GateReport:
    import time

    t0 = time.perf_counter()
    ref = sequence_logprobs(trainer_model, probe, pad_token_id)
    got = engine.prompt_logprobs(probe)
    mean, mx, n = logprob_gap(got, ref)
    return GateReport(mean, mx, n, mean_tol, max_tol, time.perf_counter() - t0)


def sync_weights(engine: Engine, named_tensors: Iterable[tuple[str, torch.Tensor]], trainer_model: Any,
                 probe: Sequence[Sequence[int]], *, pad_token_id: int, mean_tol: float, max_tol: float) -> GateReport:
    """Load the trainer's weights into the engine in place, then gate: raise ``SyncGateError`` on a mismatch."""
    import time

    t0 = time.perf_counter()
    engine.load_weights(named_tensors)
    report = check_gate(engine, trainer_model, probe, pad_token_id=pad_token_id, mean_tol=mean_tol, max_tol=max_tol)
    report = GateReport(report.mean_abs, report.max_abs, report.n_tokens, mean_tol, max_tol,
                        time.perf_counter() - t0)
    if not report.passed:
        raise SyncGateError(
            f"after the weight sync the {engine.name} engine's logprobs differ from the trainer's on the probe "
            f"batch by mean {report.mean_abs:.4f} (tolerance {mean_tol}) and max {report.max_abs:.4f} (tolerance "
            f"{max_tol}) over {report.n_tokens} tokens: the engine is not serving the trained weights. Check the "
            f"weight names/dtypes passed to load_weights, or widen rollout.sync_mean_tol / rollout.sync_max_tol "
            f"only if the engine runs at a lower precision than measured here")
    return report


def probe_batch(renderer: Any, texts: Sequence[tuple[str, str]]) -> list[list[int]]:
    """Fixed probe sequences: each (user, assistant) pair rendered as a full chat through the model's template."""
    from ragen.agent.chat import Message

    return [renderer.render([Message("user", u), Message("assistant", a)]).ids for u, a in texts]


DEFAULT_PROBE = (
    ("Push the box onto the target.\n#####\n#P_XO#\n#####", "<think>The box is right of me.</think>"
                                                             "<answer>Right || Right</answer>"),
    ("Choose an arm: Phoenix or Dragon?", "<think>Phoenix pays more often.</think><answer>Phoenix</answer>"),
    ("You are on a frozen lake. Reach G and avoid holes.\nP_H\n__G",
     "<think>Down first, then right.</think><answer>Down || Right || Right</answer>"),
)
