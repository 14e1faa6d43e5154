"""Weight sync into the running engine, and the sync gate that proves it took.

The gate scores a fixed probe batch with the engine and with the trainer's model; the mean and max absolute
logprob gaps must stay within tolerances. Measured on SmolLM2-135M (205 probe tokens): a bf16 vLLM engine against
the fp32 trainer is 0.058-0.082 apart on average (max 0.33-0.50), and even HF in bf16 is 0.075 from vLLM bf16, so
bf16 rounding bounds what a gate can see. A sync that failed (fp32 tensors not taken, weights garbled) measured
0.67 mean / 3.4 max, far outside the defaults (0.15 / 2.5); a small real update (0.1% weight noise) is inside
them. With an fp32 engine (``model.dtype=fp32``) the gap is ~1e-5 and tolerances can be tight (the tests use
0.01 / 0.05).

The floor moves with the weights, though: a model whose fp32 weights sit off the bf16 grid (an SFT warm-start)
measures 0.11-0.15 after every sync of a healthy run, against 0.05-0.08 for the base model. A fixed 0.15 then
trips on noise. So the gate calibrates: when a run opens, the engine and the trainer load the same checkpoint and
their gap on the probe is this model's precision floor; a later sync passes while its mean gap stays within
``max(sync_mean_tol, sync_floor_factor x floor)`` (``gate_tolerance``). The floor itself must be within
``max(1, factor) x sync_mean_tol``, else the engine never served the trainer's weights."""

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
    floor: float | None = None  # the calibrated precision floor the mean tolerance came from, if any

    @property
    def passed(self) -> bool:
        return self.mean_abs <= self.mean_tol and self.max_abs <= self.max_tol

    def metrics(self, prefix: str = "sync/") -> dict[str, float]:
        return {f"{prefix}logprob_gap_mean": self.mean_abs, f"{prefix}logprob_gap_max": self.max_abs,
                f"{prefix}seconds": self.seconds}


def gate_tolerance(mean_tol: float, floor: float | None, factor: float) -> float:
    """The mean-gap tolerance of a sync: the fixed one, widened to ``factor`` times the calibrated floor when that
    is larger (never narrowed: an fp32 engine's ~1e-5 floor keeps the fixed tolerance)."""
    if floor is None or factor <= 0:
        return mean_tol
    return max(mean_tol, factor * floor)


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


def calibrate_gate(engine: Engine, trainer_model: Any, probe: Sequence[Sequence[int]], *, pad_token_id: int,
                   mean_tol: float, max_tol: float, factor: float) -> GateReport:
    """Measure the precision floor: engine vs trainer on the probe while both hold the same weights (call it right
    after both loaded one checkpoint). Raises ``SyncGateError`` when even that gap is out of bounds."""
    limit = max(1.0, factor) * mean_tol
    report = check_gate(engine, trainer_model, probe, pad_token_id=pad_token_id, mean_tol=limit, max_tol=max_tol)
    if not report.passed:
        raise SyncGateError(
            f"before any update the {engine.name} engine's logprobs differ from the trainer's on the probe batch by "
            f"mean {report.mean_abs:.4f} (limit {limit:.4g} = max(1, rollout.sync_floor_factor) x "
            f"rollout.sync_mean_tol) and max {report.max_abs:.4f} (tolerance {max_tol}) over {report.n_tokens} "
            f"tokens: the engine did not load the weights the trainer did. Check that both read the same "
            f"checkpoint and that model.dtype is a precision the engine supports")
    return report


def sync_weights(engine: Engine, named_tensors: Iterable[tuple[str, torch.Tensor]], trainer_model: Any,
                 probe: Sequence[Sequence[int]], *, pad_token_id: int, mean_tol: float, max_tol: float,
                 floor: float | None = None, floor_factor: float = 0.0) -> GateReport:
    """Load the trainer's weights into the engine in place, then gate: raise ``SyncGateError`` on a mismatch.
    With a calibrated ``floor`` the mean tolerance is ``gate_tolerance(mean_tol, floor, floor_factor)``."""
    import time

    t0 = time.perf_counter()
    engine.load_weights(named_tensors)
    tol = gate_tolerance(mean_tol, floor, floor_factor)
    report = check_gate(engine, trainer_model, probe, pad_token_id=pad_token_id, mean_tol=tol, max_tol=max_tol)
    report = GateReport(report.mean_abs, report.max_abs, report.n_tokens, tol, max_tol, time.perf_counter() - t0,
                        floor)
    if not report.passed:
        why = (f"max(rollout.sync_mean_tol {mean_tol}, rollout.sync_floor_factor {floor_factor} x calibrated floor "
               f"{floor:.4f})" if tol != mean_tol else "rollout.sync_mean_tol")
        raise SyncGateError(
            f"after the weight sync the {engine.name} engine's logprobs differ from the trainer's on the probe "
            f"batch by mean {report.mean_abs:.4f} (tolerance {tol:.4g}: {why}) and max {report.max_abs:.4f} "
            f"(tolerance {max_tol}) over {report.n_tokens} tokens: the engine is not serving the trained weights. "
            f"Check the weight names/dtypes passed to load_weights, or widen rollout.sync_mean_tol / "
            f"rollout.sync_max_tol only if the engine runs at a lower precision than measured here")
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
