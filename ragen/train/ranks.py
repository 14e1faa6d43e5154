"""The whole loop under a launcher (``torchrun`` / ``deepspeed``, WORLD_SIZE > 1).

Rank 0 runs the loop as it runs alone: the run directory and its lock, instances, episodes, evaluation, tracking.
Every rank holds a share of the trainer (DeepSpeed over the launcher's process group), so rank 0's trainer
announces each call that holds a collective (build, update, calibrate, sync, save) and the other ranks make the same
call on their own trainer, in the same order, with the same arguments: the update sees the whole filtered batch on
every rank and each takes trajectories ``rank::world`` of each mini-batch (train/update.py). With vLLM, every rank
also holds an engine and generates its share of each rollout call (rollout/shards.py); building, generating with and
closing it are announced the same way, and a generate call is answered back through the store.

Announcements go through the launcher's key-value store, not a collective: a follower waits there for as long as
rank 0's rollouts take (``follower_wait_s``), while a collective would time out after the process group's
30 minutes. Meanwhile every rank's heartbeat (train/watchdog.py) ends the launch when one rank hangs. Values
travel as plain data (train/wire.py), never pickled: the store listens where the launcher puts it, and whoever
reaches it can disturb the run but cannot run code on its ranks (docs/threat-model.md)."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from ragen.train import wire

# how long a follower waits for rank 0's next call: rollouts and evaluation of one iteration, on a slow machine
FOLLOWER_WAIT_S = 24 * 3600.0
_PREFIX = "ragen/trainer/"
# torch's libuv TCP store refuses a value over 8 MiB (it resets the connection): larger messages (a generate call
# carries every prompt) go in parts under "<key>/part/<i>", and the key itself holds this header and their count
CHUNK_BYTES = 4 * 2**20
_PARTS = b"\x00ragen-parts:"  # no plain-data message (JSON) starts so


class LaunchError(RuntimeError):
    """A setting a launched run (several ranks) cannot use."""


def launched() -> bool:
    """True under a launcher that started several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def launcher_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def check_engine_layout(world: int, tensor_parallel: int) -> None:
    """One vLLM engine per ``tensor_parallel`` ranks (rollout/shards.py): it must divide the launch."""
    if world % tensor_parallel:
        raise LaunchError(f"rollout.tensor_parallel_size={tensor_parallel} does not divide the launch's {world} "
                          f"ranks: each vLLM engine spans that many ranks; launch a multiple of it")


class Announcements:
    """Numbered calls from rank 0 to the other ranks through a key-value store (the launch's: ``of_launch``).
    Rank 0 drops a call's value once every follower has read it."""

    def __init__(self, store: Any, rank: int, world: int, follower_wait_s: float = FOLLOWER_WAIT_S) -> None:
        import torch.distributed as dist

        self.store = dist.PrefixStore(_PREFIX, store)
        self.rank, self.world = rank, world
        self.wait = timedelta(seconds=follower_wait_s)
        self.sent = 0  # rank 0: calls posted; a follower: calls read
        self.unread: list[int] = []
        self.parts: dict[str, int] = {}  # rank 0: a posted call's key -> its parts (dropped with the key)

    def _put(self, key: str, raw: bytes) -> int:
        """A value of any size: in parts of ``CHUNK_BYTES`` when larger, written before the key a reader waits on.
        Returns the number of parts (0: the value is the key's own)."""
        if len(raw) <= CHUNK_BYTES:
            self.store.set(key, raw)
            return 0
        n = -(-len(raw) // CHUNK_BYTES)
        for i in range(n):
            self.store.set(f"{key}/part/{i}", raw[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES])
        self.store.set(key, _PARTS + str(n).encode())
        return n

    def _take(self, key: str) -> tuple[bytes, int]:
        """The whole value under ``key`` and the number of parts it came in (0: the key's own)."""
        raw = self.store.get(key)
        if not raw.startswith(_PARTS):
            return raw, 0
        n = int(raw[len(_PARTS):])
        return b"".join(self.store.get(f"{key}/part/{i}") for i in range(n)), n

    def _drop(self, key: str, parts: int | None = None) -> None:
        for i in range(self.parts.pop(key, 0) if parts is None else parts):
            self.store.delete_key(f"{key}/part/{i}")
        self.store.delete_key(key)

    @classmethod
    def of_launch(cls) -> Announcements:
        """Over the store of the launcher's process group (initialised here if it is not yet)."""
        import torch.distributed as dist

        from ragen.train.ds import ensure_distributed

        rank, world = ensure_distributed()
        return cls(dist.distributed_c10d._get_default_store(), rank, world)

    def post(self, call: str, *args: Any) -> int:
        """Announce a call; returns its number (for ``answers``)."""
        if self.rank != 0:
            raise RuntimeError("only rank 0 announces trainer calls")
        self._forget_read()
        self.sent += 1
        self.parts[str(self.sent)] = self._put(str(self.sent), wire.encode([call, list(args)]))
        self.unread.append(self.sent)
        return self.sent

    def _forget_read(self) -> None:
        for n in list(self.unread):
            if self.store.add(f"{n}/read", 0) >= self.world - 1:
                self._drop(str(n))
                self.store.delete_key(f"{n}/read")
                self.unread.remove(n)

    def next(self) -> tuple[str, tuple[Any, ...]]:
        self.sent += 1
        key = str(self.sent)
        try:
            self.store.wait([key], self.wait)
        except RuntimeError as e:  # torch's DistStoreError on a timeout
            raise TimeoutError(f"rank {self.rank}: no call from rank 0 within {self.wait} (call {key}); rank 0 "
                               f"is stuck or gone") from e
        call, args = wire.decode(self._take(key)[0])
        args = tuple(args)
        self.store.add(f"{key}/read", 1)
        return call, args

    def answer(self, value: Any) -> None:
        """A follower's result of the call it read last (an exception is raised again on rank 0)."""
        self._put(f"{self.sent}/answer/{self.rank}", wire.encode(value))

    def answers(self, call: int, ranks: list[int]) -> dict[int, Any]:
        """Rank 0: the followers' answers to call number ``call``, by rank; an answer that is an exception is
        raised here, naming its rank."""
        keys = [f"{call}/answer/{r}" for r in ranks]
        try:
            self.store.wait(keys, self.wait)
        except RuntimeError as e:
            raise TimeoutError(f"rank 0: no answer to call {call} from ranks {ranks} within {self.wait}") from e
        got = {}
        for r, key in zip(ranks, keys, strict=True):
            raw, parts = self._take(key)
            got[r] = wire.decode(raw)
            self._drop(key, parts)
        for r, value in got.items():
            if isinstance(value, BaseException):
                raise RuntimeError(f"rank {r} failed in call {call}: {value}") from value
        return got


def launch_watchdog(channel: Announcements) -> Any:
    """This rank's heartbeat over the launch's store (train/watchdog.py): a hung rank ends the launch."""
    import torch.distributed as dist

    from ragen.train.watchdog import Watchdog, separate_client

    store = separate_client(dist.distributed_c10d._get_default_store())
    return Watchdog(store, channel.rank, channel.world).start()


def follow(channel: Announcements | None = None) -> bool:
    """A follower rank's life: build, use and drop trainers as rank 0 announces, until rank 0 says it is done.
    Returns whether rank 0 finished without an error. In a launch (no ``channel`` given) a heartbeat runs
    meanwhile, so a hung rank 0 ends this rank within the watchdog's bound."""
    if channel is not None:
        return _follow(channel)
    channel = Announcements.of_launch()
    dog = launch_watchdog(channel)
    try:
        return _follow(channel)
    finally:
        dog.finish()


def _follow(channel: Announcements) -> bool:
    from ragen.config import Config
    from ragen.rollout.factory import make_renderer
    from ragen.train.trainer import Trainer

    trainer: Trainer | None = None
    engine: Any = None  # this rank's vLLM engine, when rollouts are shared over the ranks (rollout/shards.py)
    while True:
        call, args = channel.next()
        if call == "exit":
            return bool(args[0])
        if call == "open":
            data, resume, model_path = args  # the config as plain data (train/wire.py)
            cfg = Config.model_validate(data)
            trainer = Trainer(cfg, resume=resume, model_path=model_path, renderer=make_renderer(cfg))
        elif call == "close":
            trainer = None
            gc.collect()
        elif call in ("engine", "generate", "engine_close"):
            engine = _engine_call(channel, engine, call, args)
        elif trainer is None:
            raise RuntimeError(f"rank {channel.rank}: rank 0 announced {call!r} before building a trainer")
        elif call in ("update", "save"):
            if call == "update" and engine is not None:
                engine.sleep()  # as rank 0's: the update gets the GPU, the sync wakes the engine
            getattr(trainer, call)(*args)
        elif call in ("calibrate", "sync"):  # this rank's engine, or the trainer's side of the gate alone
            getattr(trainer, call)(engine)
        else:
            raise RuntimeError(f"rank {channel.rank}: unknown trainer call {call!r} from rank 0")


def _engine_call(channel: Announcements, engine: Any, call: str, args: tuple[Any, ...]) -> Any:
    """A follower's part in rollouts shared over the ranks: build its engine, generate its shard of a call (the
    answer goes back to rank 0, an error included), close it. Returns the engine it holds after the call."""
    from ragen.config import Config
    from ragen.rollout import shards

    if call == "engine":
        data, model_path = args
        return shards.local_engine(Config.model_validate(data), model_path)
    if engine is None:
        raise RuntimeError(f"rank {channel.rank}: rank 0 announced {call!r} before building an engine")
    if call == "engine_close":
        engine.close()
        return None
    try:
        channel.answer(shards.generate_shard(engine, channel.rank, *args))
    except Exception as e:  # rank 0 raises it, naming this rank, instead of waiting for an answer
        import traceback

        traceback.print_exc()
        channel.answer(e)  # travels as its text (train/wire.py); rank 0 raises it naming this rank
    return engine


_leader: list[Announcements] = []


def announcer() -> Announcements | None:
    """Rank 0's channel while it leads a launch (``leading``); None elsewhere."""
    return _leader[0] if _leader else None


@contextmanager
def leading() -> Iterator[Announcements | None]:
    """For the life of a command on rank 0 of a launch: trainers built meanwhile announce their calls, and the
    followers are told at the end whether rank 0 finished cleanly. Yields None when not launched."""
    if not launched():
        yield None
        return
    if launcher_rank() != 0:
        raise RuntimeError("leading() is rank 0's; the other ranks call follow()")
    channel = Announcements.of_launch()
    dog = launch_watchdog(channel)
    _leader[:] = [channel]
    ok = False
    try:
        yield channel
        ok = True
    finally:
        _leader.clear()
        channel.post("exit", ok)
        dog.finish()
