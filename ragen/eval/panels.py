"""Evaluation panels: a fixed list of seeds per env tag, stored as a small JSON file (DVC-tracked), so every run
and checkpoint is scored on the same tasks. Seeds are consecutive blocks from a base seed in tag order, as the
original validation set lays out several tags (docs/evaluation.md: 123, 123 + n, ...)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# The generalisation tags of the paper (App. G, Table 4): train on Bandit or SimpleSokoban, score on all of these.
GENERALISATION_TAGS = ("Bandit", "BanditTest", "BanditTestRev", "SimpleSokoban", "LargerSokoban",
                       "SokobanDifferentGridVocab", "FrozenLake")
PANEL_SIZES = {"paper": 256, "cpu-small": 32, "tiny": 4}  # seeds per tag at each scale
VAL_SEED = 123


@dataclass(frozen=True)
class Panel:
    name: str
    seeds: Mapping[str, tuple[int, ...]]  # tag -> seeds, in tag order

    @property
    def tags(self) -> list[str]:
        return list(self.seeds)

    def select(self, tags: Sequence[str] | None) -> Panel:
        """The panel restricted to ``tags`` (None: all); a tag the panel lacks is an error."""
        if tags is None:
            return self
        missing = [t for t in tags if t not in self.seeds]
        if missing:
            raise KeyError(f"panel {self.name!r} has no seeds for {missing}; it has {self.tags} (make a panel with "
                           f"those tags: `ragen eval panel --tags ...`)")
        return Panel(self.name, {t: self.seeds[t] for t in tags})

    def pairs(self) -> list[tuple[str, int]]:
        return [(t, s) for t, seeds in self.seeds.items() for s in seeds]

    def to_dict(self) -> dict:
        return {"name": self.name, "seeds": {t: list(s) for t, s in self.seeds.items()}}


def make_panel(name: str, tags: Sequence[str], n_per_tag: int, base_seed: int = VAL_SEED) -> Panel:
    if n_per_tag < 1:
        raise ValueError(f"a panel needs at least 1 seed per tag, got {n_per_tag}")
    if len(set(tags)) != len(tags) or not tags:
        raise ValueError(f"panel tags must be distinct and non-empty, got {list(tags)}")
    return Panel(name, {t: tuple(range(base_seed + i * n_per_tag, base_seed + (i + 1) * n_per_tag))
                        for i, t in enumerate(tags)})


def scale_panel(scale: str, tags: Sequence[str] = GENERALISATION_TAGS) -> Panel:
    if scale not in PANEL_SIZES:
        raise KeyError(f"unknown panel scale {scale!r}; known: {', '.join(PANEL_SIZES)}")
    return make_panel(scale, tags, PANEL_SIZES[scale])


def write_panel(panel: Panel, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = ",\n".join(f"  {json.dumps(t)}: {json.dumps(list(s))}" for t, s in panel.seeds.items())
    path.write_text(f'{{"name": {json.dumps(panel.name)}, "seeds": {{\n{body}\n}}}}\n')  # a tag per line
    return path


def read_panel(path: str | Path, known_tags: Sequence[str] | None = None) -> Panel:
    """A panel file, checked: a mapping of tags to lists of distinct non-negative integer seeds."""
    path = Path(path)
    fix = "make it with `ragen eval panel --out FILE` (or `dvc repro panel`)"
    if not path.is_file():
        raise FileNotFoundError(f"eval panel {path} does not exist; {fix}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"eval panel {path} is not valid JSON ({e}); {fix}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("seeds"), dict) or not raw["seeds"]:
        raise ValueError(f"eval panel {path}: expected {{'name': ..., 'seeds': {{tag: [seed, ...]}}}}; {fix}")
    seeds: dict[str, tuple[int, ...]] = {}
    for tag, lst in raw["seeds"].items():
        if known_tags is not None and tag not in known_tags:
            raise ValueError(f"eval panel {path}: unknown tag {tag!r}; known: {', '.join(sorted(known_tags))}")
        if not isinstance(lst, list) or not lst or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           and s >= 0 for s in lst):
            raise ValueError(f"eval panel {path}: seeds of {tag!r} must be a non-empty list of integers >= 0")
        if len(set(lst)) != len(lst):
            raise ValueError(f"eval panel {path}: seeds of {tag!r} repeat")
        seeds[tag] = tuple(lst)
    return Panel(str(raw.get("name", path.stem)), seeds)
