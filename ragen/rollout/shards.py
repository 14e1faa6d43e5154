"""Rollouts shared over the ranks of a launch: one vLLM engine per rank (vLLM's ``external_launcher``, as TRL's
colocate mode and verl run it), each next to that rank's share of the trainer.

Rank 0 still runs the loop (environments, episodes, evaluation); each ``generate`` call is cut into contiguous
shards, one per group of ``rollout.tensor_parallel_size`` ranks, announced to the other ranks (train/ranks.py),
and their answers are put back in the prompts' order. Every engine shares the launcher's process group, so
building one is collective: all ranks build theirs together when rank 0 announces it.

Repeatability: shard 0 samples with the call's seed, shard ``s`` with a seed derived from (seed, s), so prompts
that repeat within a call (a group's members) draw different samples on every rank, and the same call on the same
number of ranks samples the same tokens. Other rank counts cut the batch differently, so they sample differently
(greedy calls excepted), as a different batch does in one process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from ragen.config import Config
from ragen.rollout.engine import Engine, Generation, Sampling, clip_requests

_SHARD_KEY = 2  # the SeedSequence spawn key of shard seeds (env seeds use 0 and 1: envs/seeding.py)


def shard_seed(seed: int, shard: int) -> int:
    """The seed shard ``shard`` samples a call with: the call's own for shard 0 (one rank samples as one process
    does), a derived one for the others."""
    if shard == 0:
        return seed
    return int(np.random.SeedSequence(seed, spawn_key=(_SHARD_KEY, shard)).generate_state(1, np.uint32)[0])


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous [start, stop) ranges over n items, sizes differing by one at most, larger first."""
    size, extra = divmod(n, shards)
    bounds, start = [], 0
    for s in range(shards):
        stop = start + size + (s < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def shard_of(rank: int, tensor_parallel: int) -> int:
    """The shard a rank generates: ranks of one tensor-parallel group share an engine's work and its shard."""
    return rank // tensor_parallel


def local_engine(cfg: Config, model_path: str | None) -> Any:
    """This rank's engine of a launch (every rank builds one, together)."""
    from ragen.rollout.factory import make_engine

    return make_engine(cfg, None, model_path=model_path, launched=True)


def generate_shard(engine: Engine, rank: int, prompts: Sequence[Sequence[int]], sampling: Sampling, seed: int,
                   caps: Sequence[int] | None, tensor_parallel: int, world: int) -> list[Generation]:
    """What ``rank`` generates of one announced call: its shard, with its shard's seed."""
    s = shard_of(rank, tensor_parallel)
    lo, hi = shard_bounds(len(prompts), world // tensor_parallel)[s]
    if lo == hi:
        return []
    return engine.generate(prompts[lo:hi], sampling, seed=shard_seed(seed, s),
                           max_new_tokens=None if caps is None else caps[lo:hi])


class Channel(Protocol):
    """What rank 0 tells the other ranks of a launch, and reads back (``train.ranks.Announcements``)."""

    world: int

    def post(self, call: str, *args: Any) -> int:
        """Announce ``call(*args)`` to every other rank; returns its number (for ``answers``)."""
        ...

    def answers(self, call: int, ranks: list[int]) -> dict[int, Any]:
        """The answers of ``ranks`` to call number ``call``, by rank (an answer that is an exception is raised)."""
        ...


class ShardedEngine:
    """Rank 0's engine under a launch: generation shared over every rank's engine; the sync gate's probe,
    weights and sleep are this rank's (the others load and gate theirs when rank 0's trainer announces a sync)."""

    name = "vllm"

    def __init__(self, local: Engine, channel: Channel, tensor_parallel: int) -> None:
        self.local, self.channel, self.tp = local, channel, tensor_parallel
        self.world = channel.world

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, *, seed: int,
                 max_new_tokens: Sequence[int] | None = None) -> list[Generation]:
        if not prompts:
            return []
        prompts = [list(p) for p in prompts]
        # checked here, before any rank is told of the call
        args = (prompts, sampling, seed, clip_requests(max_new_tokens, len(prompts), sampling), self.tp, self.world)
        call = self.channel.post("generate", *args)
        own = generate_shard(self.local, 0, *args)
        # one answer per shard: the first rank of each tensor-parallel group (the others generate the same)
        leaders = list(range(self.tp, self.world, self.tp))
        answers = self.channel.answers(call, list(range(1, self.world)))
        out = list(own)
        for r in leaders:
            out.extend(answers[r])
        if len(out) != len(prompts):
            raise RuntimeError(f"the ranks answered {len(out)} generations for {len(prompts)} prompts")
        return out

    def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return self.local.prompt_logprobs(sequences)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.local.load_weights(named_tensors)

    def sleep(self) -> None:
        self.local.sleep()

    def close(self) -> None:
        self.channel.post("engine_close")
        self.local.close()


def engines_on_every_rank(cfg: Config, model_path: str | None, channel: Channel) -> ShardedEngine:
    """Rank 0: tell the other ranks to build their engines, build this rank's (together: building is collective
    over the launcher's group), and share generation over them. The layout is the caller's to check
    (``train.ranks.check_engine_layout``)."""
    from ragen.config import config_to_dict

    channel.post("engine", config_to_dict(cfg), model_path)
    return ShardedEngine(local_engine(cfg, model_path), channel, cfg.rollout.tensor_parallel_size)


@contextlib.contextmanager
def launch_group_kept() -> Iterator[None]:
    """While a launched engine shuts down: vLLM's teardown destroys torch's default process group, which under a
    launcher is the launch's own (the trainers on every rank and the next engine still use it); its own
    subgroups go as usual."""
    import torch.distributed as dist

    destroy = dist.destroy_process_group

    def keep_default(group: Any = None) -> None:
        if group is not None:
            destroy(group)

    dist.destroy_process_group = keep_default
    try:
        yield
    finally:
        dist.destroy_process_group = destroy
