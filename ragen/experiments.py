"""Named experiments: a name for a set of presets and overrides, and which pipeline runs it (``train`` for RL,
``sft`` for a supervised warm-start). The ablation grid of issue 7 lists its experiments here too."""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class Experiment:
    name: str
    kind: str  # train | sft
    presets: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    description: str = ""


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("sft-baseline", "sft", ("paper", "sft-paper"),
               description="the paper's SFT baseline (App. C): LoRA r=64, alpha=32, lr 1e-4, 1000/100 BFS demos "
                           "on SimpleSokoban and FrozenLake; paper: 74.6% Sokoban, 23% FrozenLake success"),
    Experiment("sft-baseline-cpu", "sft", ("cpu-small", "sft-paper"), ("sft.n_train=128", "sft.n_test=16"),
               description="the SFT baseline's recipe on the bundled CPU model, at a size this machine trains"),
)}


def get_experiment(name: str, kind: str | None = None) -> Experiment:
    if name not in EXPERIMENTS:
        close = difflib.get_close_matches(name, list(EXPERIMENTS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"unknown experiment {name!r}{hint}; known: {', '.join(sorted(EXPERIMENTS))}")
    e = EXPERIMENTS[name]
    if kind is not None and e.kind != kind:
        raise KeyError(f"experiment {name!r} is a {e.kind} experiment, not {kind}")
    return e
