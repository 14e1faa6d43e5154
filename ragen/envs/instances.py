"""Env-instance generation, the pipeline's first stage: which seed every env of an iteration is reset with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd

from ragen.envs.base import TextEnv
from ragen.envs.registry import TagSpec, get_tag
from ragen.envs.seeding import GroupRng, group_base_seed, member_stream
from ragen.tables import read_table, write_table

COLUMNS = ["iteration", "mode", "env_id", "tag", "group", "member", "seed", "stream", "initial_state",
           "optimal_length"]


@dataclass(frozen=True)
class Instance:
    env_id: int
    tag: str
    group: int
    member: int
    seed: int
    stream: int | None  # the ``member`` reset option (None = the group's shared dynamics stream)


def group_tags(tags: Sequence[str], n_groups: Sequence[int]) -> list[str]:
    """Tag of each group: consecutive groups per tag, in order (docs/environments.md, seeds)."""
    if len(tags) != len(n_groups):
        raise ValueError(f"tags ({len(tags)}) and n_groups ({len(n_groups)}) must have the same length")
    if any(n < 0 for n in n_groups):
        raise ValueError(f"n_groups must be non-negative, got {list(n_groups)}")
    return [tag for tag, n in zip(tags, n_groups, strict=True) for _ in range(n)]


def plan_instances(tags: Sequence[str], n_groups: Sequence[int], group_size: int, base_seed: int,
                   group_rng: GroupRng = "independent", seed_cycle: Sequence[int] | None = None) -> list[Instance]:
    """All envs of one reset: group g has seed base_seed + g (or, with ``seed_cycle``, the entry base_seed + g
    of it, cyclically); members share it; env_id = g * size + m."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    per_group = group_tags(tags, n_groups)

    def seed(g: int) -> int:
        return base_seed + g if not seed_cycle else int(seed_cycle[(base_seed + g) % len(seed_cycle)])

    return [Instance(g * group_size + m, tag, g, m, seed(g), member_stream(m, group_rng))
            for g, tag in enumerate(per_group) for m in range(group_size)]


def generate_instances(tags: Sequence[str], n_groups: Sequence[int], group_size: int, *, seed: int,
                       iteration: int = 0, mode: Literal["train", "val"] = "train",
                       group_rng: GroupRng = "independent", tag_specs: Mapping[str, TagSpec] | None = None,
                       seed_cycle: Sequence[int] | None = None) -> pd.DataFrame:
    """The instances table of one iteration. ``seed`` is the train or val base seed: train iteration k starts
    at seed + env_groups * k, val always at seed. One row per env. ``seed_cycle`` (envs.train_seeds): group g of
    iteration k takes its entry env_groups * k + g instead, cyclically."""
    plan = iteration_plan(tags, n_groups, group_size, seed=seed, iteration=iteration, mode=mode,
                          group_rng=group_rng, seed_cycle=seed_cycle)
    return build_instances(plan, iteration=iteration, mode=mode, tag_specs=tag_specs)


def iteration_plan(tags: Sequence[str], n_groups: Sequence[int], group_size: int, *, seed: int, iteration: int,
                   mode: Literal["train", "val"] = "train", group_rng: GroupRng = "independent",
                   seed_cycle: Sequence[int] | None = None) -> list[Instance]:
    """The planned instances of one iteration (``generate_instances`` without resetting an env)."""
    base = group_base_seed(mode, iteration, sum(n_groups), 0 if seed_cycle else seed)
    return plan_instances(tags, n_groups, group_size, base, group_rng, seed_cycle)


def planned_train_seeds(tags: Sequence[str], n_groups: Sequence[int], *, seed: int, iterations: int,
                        seed_cycle: Sequence[int] | None = None) -> dict[str, set[int]]:
    """Every seed each tag's groups are reset with over ``iterations`` training iterations (what
    ``generate_instances`` would use, without building an env): to check an evaluation panel never trains."""
    out: dict[str, set[int]] = {}
    for k in range(iterations):
        for inst in iteration_plan(tags, n_groups, 1, seed=seed, iteration=k, seed_cycle=seed_cycle):
            out.setdefault(inst.tag, set()).add(inst.seed)
    return out


def seeded_instances(tag_seeds: Sequence[tuple[str, int]], group_size: int, *, mode: Literal["train", "val"] = "val",
                     group_rng: GroupRng = "independent",
                     tag_specs: Mapping[str, TagSpec] | None = None) -> pd.DataFrame:
    """Instances for an explicit list of (tag, seed), one group of ``group_size`` per entry (evaluation panels)."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    plan = [Instance(g * group_size + m, tag, g, m, int(seed), member_stream(m, group_rng))
            for g, (tag, seed) in enumerate(tag_seeds) for m in range(group_size)]
    return build_instances(plan, iteration=0, mode=mode, tag_specs=tag_specs)


def build_instances(plan: Sequence[Instance], *, iteration: int, mode: str,
                    tag_specs: Mapping[str, TagSpec] | None = None) -> pd.DataFrame:
    """Reset one env per group of the plan to read its initial state (members share it)."""
    envs: dict[str, TextEnv] = {}
    rows = []
    cached: dict[int, tuple[str, int | None]] = {}
    for inst in plan:
        if inst.group not in cached:  # members share the initial state: build it once per group
            env = envs.get(inst.tag)
            if env is None:
                env = envs[inst.tag] = get_tag(inst.tag, tag_specs).make()
            state, _ = env.reset(seed=inst.seed)
            cached[inst.group] = (state, env.optimal_length())
        state, opt = cached[inst.group]
        rows.append((iteration, mode, inst.env_id, inst.tag, inst.group, inst.member, inst.seed, inst.stream,
                     state, opt))
    df = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("stream", "optimal_length"):
        df[col] = df[col].astype("Int64")
    return df


def write_instances(df: pd.DataFrame, path: str | Path) -> Path:
    return write_table(df, path)


def read_instances(path: str | Path) -> pd.DataFrame:
    return read_table(path, "instances", COLUMNS, "regenerate it with `ragen envs instances`")
