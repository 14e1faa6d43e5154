"""Rank 0's announcements to the other ranks of a launch (ragen/train/ranks.py), over an in-memory store shared
by a leader and a follower in one process."""

import pytest
import torch.distributed as dist

from ragen.train import ranks
from ragen.train.ranks import Announcements, follow

pytestmark = pytest.mark.unit


def pair(world=2, wait=5.0):
    store = dist.HashStore()
    return Announcements(store, 0, world, wait), [Announcements(store, r, world, wait) for r in range(1, world)]


def test_calls_arrive_in_order_with_their_arguments():
    lead, (f,) = pair()
    lead.post("update", {"rows": [1, 2]}, 3)
    lead.post("save", "/runs/a/states/iter_00003")
    assert f.next() == ("update", ({"rows": [1, 2]}, 3))
    assert f.next() == ("save", ("/runs/a/states/iter_00003",))


def test_a_call_is_dropped_once_every_follower_read_it():
    lead, (f1, f2) = pair(world=3)
    lead.post("update", "batch", 0)
    f1.next()
    lead.post("sync")
    assert lead.unread == [1, 2]  # rank 2 has not read call 1 yet: it stays
    f2.next()
    f1.next()
    f2.next()
    lead.post("save", "x")
    assert lead.unread == [3]
    assert not lead.store.check(["1"]) and not lead.store.check(["2"])


def test_only_rank_0_announces():
    _, (f,) = pair()
    with pytest.raises(RuntimeError, match="only rank 0"):
        f.post("update")


def test_a_follower_that_hears_nothing_says_rank_0_is_stuck():
    _, (f,) = pair(wait=0.2)
    with pytest.raises(TimeoutError, match="rank 1: no call from rank 0 within"):
        f.next()


def test_follow_ends_with_rank_0s_outcome_and_refuses_calls_out_of_order():
    lead, (f,) = pair()
    lead.post("exit", False)
    assert follow(f) is False
    lead.post("close")
    lead.post("exit", True)
    assert follow(f) is True
    lead.post("update", "batch", 0)
    with pytest.raises(RuntimeError, match="announced 'update' before building a trainer"):
        follow(f)


def test_leading_outside_a_launch_is_a_no_op(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    with ranks.leading() as channel:
        assert channel is None and ranks.announcer() is None


def test_leading_is_rank_0s(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(RuntimeError, match="rank 0's"), ranks.leading():
        pass


def test_a_launched_run_refuses_what_one_rank_cannot_do_alone(monkeypatch):
    from ragen.config import load_config
    from ragen.run.iteration import Runtime
    from ragen.sft.pipeline import check_buildable_here

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ranks.LaunchError, match=r"rollout.engine=vllm under a launcher needs rank 0 to lead.*"
                                                r"`ragen train` on every rank"):
        Runtime(load_config(None, ["cpu-small"], ["rollout.engine=vllm"])).open()
    with pytest.raises(ranks.LaunchError, match=r"model.warm_start=auto.*ragen sft train"):
        check_buildable_here()


def test_a_pickle_planted_in_the_store_is_refused_and_never_run():
    import builtins
    import pickle

    from ragen.train.wire import WireError

    class Planted:
        def __reduce__(self):
            return exec, ("import builtins; builtins._ragen_planted_ran = True",)

    lead, (f,) = pair()
    lead.store.set("1", pickle.dumps(("update", (Planted(),))))  # what anyone reaching the store could write
    with pytest.raises(WireError, match="not this project's plain data"):
        f.next()
    assert not hasattr(builtins, "_ragen_planted_ran")


def test_a_followers_error_reaches_rank_0_naming_the_rank():
    lead, (f,) = pair()
    n = lead.post("generate", [[1, 2]])
    f.next()
    f.answer(ValueError("out of KV cache"))
    with pytest.raises(RuntimeError, match="rank 1 failed in call 1: ValueError: out of KV cache"):
        lead.answers(n, [1])


def test_calls_and_answers_over_the_stores_8_mib_limit_travel_in_parts():
    """torch's libuv TCP store resets the connection on a value over 8 MiB; a generate call carries every prompt."""
    import datetime

    from ragen.train.ds import free_port

    store = dist.TCPStore("127.0.0.1", free_port(), 2, True, timeout=datetime.timedelta(seconds=30),
                          wait_for_workers=False)
    lead, f = Announcements(store, 0, 2, 10.0), Announcements(store, 1, 2, 10.0)
    prompts = [[i % 50_000] * 1000 for i in range(3000)]  # 3M token ids: ~17 MB as JSON
    n = lead.post("generate", prompts)
    assert lead.parts["1"] >= 3
    call, (got,) = f.next()
    assert call == "generate" and got == prompts
    f.answer({"texts": ["y" * 10 * 2**20]})  # a 10 MiB answer back
    assert lead.answers(n, [1]) == {1: {"texts": ["y" * 10 * 2**20]}}
    assert not lead.store.check([f"{n}/answer/1"]) and not lead.store.check([f"{n}/answer/1/part/0"])  # dropped
    assert lead.store.check(["1/part/0"])
    lead.post("sync")  # rank 1 read call 1: its parts go with it
    assert not lead.store.check(["1"]) and not lead.store.check(["1/part/0"])
