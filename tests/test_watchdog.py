"""Heartbeats between the ranks of a launch (ragen/train/watchdog.py), on an in-memory store with a hand-driven
clock: a rank whose counter stops moving is named once it has been quiet past the bound, a rank that finished is
not waited for, and the bound comes from RAGEN_RANK_STALE_S."""

import pytest
import torch.distributed as dist

from ragen.train import watchdog
from ragen.train.watchdog import Watchdog

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def ranks(world=3, stale_after=30.0):
    store, clock, named = dist.HashStore(), Clock(), []
    dogs = [Watchdog(store, r, world, stale_after=stale_after, clock=clock,
                     on_stale=lambda rank, stale, quiet: named.append((rank, stale, quiet))) for r in range(world)]
    return dogs, clock, named


def test_a_rank_that_stops_beating_is_named_after_the_bound_and_not_before():
    (r0, r1, r2), clock, named = ranks()
    for t in range(0, 61, 5):  # all three beat every 5 s for a minute: nobody is quiet
        clock.t = float(t)
        for d in (r0, r1, r2):
            assert d.check() == []
    # rank 1 hangs at t = 60 (its thread stopped with it); the others keep beating
    for t in range(65, 91, 5):
        clock.t = float(t)
        assert r0.check() == [] and r2.check() == []
    # rank 0 checked before rank 1's last beat at t = 60 and saw it at 65; rank 2 checked after it, at 60
    clock.t = 95.0
    assert r0.check() == []  # quiet 30 s for rank 0: not past the bound yet
    clock.t = 100.0
    assert r0.check() == [(1, 35.0)]
    assert named == [(0, 1, 35.0)]
    assert r2.check() == [(1, 40.0)]


def test_a_finished_rank_is_not_waited_for():
    (r0, r1), clock, named = ranks(world=2)
    r0.check(), r1.check()
    r1.finish()  # rank 1 ended cleanly (it never started a thread here)
    clock.t = 1000.0
    assert r0.check() == [] and named == []


def test_a_rank_that_never_beat_is_named_once_quiet_past_the_bound():
    (r0, _), clock, named = ranks(world=2)
    r0.check()  # rank 1 never came up: counted from when rank 0 first looked
    clock.t = 31.0
    assert r0.check() == [(1, 31.0)] and named == [(0, 1, 31.0)]


def test_the_bound_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("RAGEN_RANK_STALE_S", "45")
    assert watchdog.stale_after_s() == 45.0
    for bad, match in (("soon", "not a number"), ("2", "must exceed the heartbeat interval")):
        monkeypatch.setenv("RAGEN_RANK_STALE_S", bad)
        with pytest.raises(ValueError, match=match):
            watchdog.stale_after_s()
    monkeypatch.delenv("RAGEN_RANK_STALE_S")
    assert watchdog.stale_after_s() == watchdog.STALE_AFTER_S


def test_the_heartbeat_thread_beats_until_finished():
    store = dist.HashStore()
    dog = Watchdog(store, 0, 2, beat_s=0.01, stale_after=60.0).start()
    import time

    time.sleep(0.2)
    dog.finish()
    beats = dog.store.add("0", 0)
    assert beats >= 5 and dog.store.check(["0/done"])
    time.sleep(0.05)
    assert dog.store.add("0", 0) == beats  # stopped
