"""Seed derivation for env instances.

An instance seed fixes the *initial state* (room, map, arm order). The *dynamics* stream (slips, payouts) is a
separate generator: members of a group share the instance seed, and with ``group_rng: independent`` each member
gets its own dynamics stream, while ``shared`` gives all members one stream, as the original code did.
Everything is derived through ``numpy.random.SeedSequence`` spawn keys, so no global RNG and no salted hash.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

GroupRng = Literal["independent", "shared"]

_LAYOUT_KEY = 0
_DYNAMICS_KEY = 1


def layout_rng(seed: int) -> np.random.Generator:
    """Generator that builds the initial state of instance ``seed``."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_LAYOUT_KEY,)))


def dynamics_seed(seed: int, member: int | None) -> int:
    """Integer seed of the dynamics stream; ``member=None`` is the stream shared by a whole group."""
    key = (_DYNAMICS_KEY,) if member is None else (_DYNAMICS_KEY, member + 1)
    return int(np.random.SeedSequence(seed, spawn_key=key).generate_state(1, np.uint64)[0])


def member_stream(member: int, group_rng: GroupRng) -> int | None:
    """The ``member`` reset option for a group member under the chosen ``group_rng`` mode."""
    if group_rng == "shared":
        return None
    if group_rng == "independent":
        return member
    raise ValueError(f"group_rng must be 'independent' or 'shared', got {group_rng!r}")


def group_base_seed(mode: Literal["train", "val"], iteration: int, env_groups: int, seed: int) -> int:
    """First group's seed (docs/environments.md, seeds): train iteration k starts at seed + env_groups * k; val
    always at seed."""
    if iteration < 0:
        raise ValueError(f"iteration must be >= 0, got {iteration}")
    if mode == "train":
        return seed + env_groups * iteration
    if mode == "val":
        return seed
    raise ValueError(f"mode must be 'train' or 'val', got {mode!r}")
