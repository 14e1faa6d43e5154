"""Rollouts shared over a launch's ranks (ragen/rollout/shards.py): rank 0 cuts each generate call into one
contiguous shard per engine, the other ranks generate theirs with their shard's seed, and the answers come back in
the prompts' order. Ranks are threads over one in-memory store here; tests/test_launcher.py runs real vLLM
engines under torchrun."""

import threading

import pytest
import torch.distributed as dist

from ragen.rollout.engine import Generation, Sampling
from ragen.rollout.shards import ShardedEngine, shard_bounds, shard_seed
from ragen.train import ranks
from ragen.train.ranks import Announcements, LaunchError, check_engine_layout

pytestmark = pytest.mark.unit


class Recorder:
    """An engine that answers each prompt with (its first token, the call's seed, its cap) and keeps its calls."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[list[list[int]], int, list[int] | None]] = []
        self.fail = fail

    def generate(self, prompts, sampling, *, seed, max_new_tokens=None):
        if self.fail:
            raise ValueError("KV cache is full")
        self.calls.append(([list(p) for p in prompts], seed, None if max_new_tokens is None else list(max_new_tokens)))
        caps = max_new_tokens or [sampling.max_new_tokens] * len(prompts)
        return [Generation([p[0], seed, c], [-1.0] * 3, "stop") for p, c in zip(prompts, caps, strict=True)]


def launch(world, tp, prompts, caps=None, failing=()):
    store = dist.HashStore()
    lead = Announcements(store, 0, world, 5.0)
    engines = {r: Recorder(fail=r in failing) for r in range(world)}

    def follower(rank):
        f = Announcements(store, rank, world, 5.0)
        call, args = f.next()
        ranks._engine_call(f, engines[rank], call, args)

    threads = [threading.Thread(target=follower, args=(r,)) for r in range(1, world)]
    for t in threads:
        t.start()
    try:
        return ShardedEngine(engines[0], lead, tp).generate(prompts, Sampling(max_new_tokens=9), seed=1234,
                                                            max_new_tokens=caps), engines
    finally:
        for t in threads:
            t.join(10)


def test_shards_are_contiguous_and_differ_in_size_by_one_at_most():
    assert shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shard_bounds(4, 2) == [(0, 2), (2, 4)]
    assert shard_bounds(1, 3) == [(0, 1), (1, 1), (1, 1)]


def test_shard_0_keeps_the_calls_seed_and_every_other_shard_has_its_own():
    assert shard_seed(1234, 0) == 1234
    seeds = [shard_seed(1234, s) for s in range(4)]
    assert len(set(seeds)) == 4 and seeds == [shard_seed(1234, s) for s in range(4)]
    assert shard_seed(1235, 1) != shard_seed(1234, 1)


def test_each_rank_generates_its_shard_with_its_seed_and_rank_0_puts_them_back_in_order():
    prompts = [[10 + i, 7] for i in range(7)]
    caps = [1, 2, 3, 4, 5, 6, 7]
    out, engines = launch(3, 1, prompts, caps)
    assert [g.token_ids[0] for g in out] == [p[0] for p in prompts]
    assert [g.token_ids[2] for g in out] == caps
    for rank, (lo, hi) in enumerate([(0, 3), (3, 5), (5, 7)]):
        (got, seed, got_caps), = engines[rank].calls
        assert got == prompts[lo:hi] and got_caps == caps[lo:hi] and seed == shard_seed(1234, rank)


def test_the_ranks_of_one_tensor_parallel_engine_share_a_shard():
    prompts = [[i] for i in range(5)]
    out, engines = launch(4, 2, prompts)
    assert [g.token_ids[0] for g in out] == list(range(5))
    assert engines[0].calls == engines[1].calls and engines[2].calls == engines[3].calls
    assert engines[0].calls[0][:2] == ([[0], [1], [2]], 1234)
    assert engines[2].calls[0][:2] == ([[3], [4]], shard_seed(1234, 1))


def test_a_rank_that_fails_is_named_on_rank_0():
    with pytest.raises(RuntimeError, match=r"rank 2 failed in call 1: ValueError: KV cache is full"):
        launch(3, 1, [[i] for i in range(6)], failing=(2,))


def test_a_tensor_parallel_size_that_does_not_divide_the_launch_is_refused():
    check_engine_layout(4, 2)
    with pytest.raises(LaunchError, match=r"rollout.tensor_parallel_size=2 does not divide the launch's 3 ranks"):
        check_engine_layout(3, 2)


def test_each_request_of_a_call_gets_its_own_repeatable_seed():
    """On CUDA a vLLM request carries its own seed (ragen/rollout/vllm_engine.py): distinct within a call,
    the same for the same call seed, apart between calls and between the shards of a call."""
    from ragen.rollout.vllm_engine import request_seeds

    seeds = request_seeds(1234, 64)
    assert len(set(seeds)) == 64 and seeds == request_seeds(1234, 64)
    assert request_seeds(1234, 8) == seeds[:8]  # a request's seed does not depend on how many follow it
    assert not set(request_seeds(1235, 64)) & set(seeds)
    assert not set(request_seeds(shard_seed(1234, 1), 64)) & set(request_seeds(shard_seed(1234, 0), 64))
    assert all(0 <= s < 2**32 for s in seeds)
