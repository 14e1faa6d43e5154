"""Heartbeats between the ranks of a launch, so a rank that hangs (stopped, deadlocked, its machine gone) ends the
launch within a stated bound instead of leaving the others waiting: in a collective until the process group's
timeout, or, as a follower, for rank 0's next call (a day: rollouts may take hours).

Every rank runs a thread that bumps its own counter in the launch's key-value store every ``beat_s`` and reads the
others'. A rank whose counter has not moved for ``stale_after_s`` (``RAGEN_RANK_STALE_S``, default 120 s) is
named on stderr and this process exits with ``STALE_EXIT``; the launcher (torchrun) then stops the remaining
ranks. So a hung rank ends the launch within about ``stale_after_s + beat_s`` plus the launcher's own teardown.
Counters, not timestamps: no clocks need agree across machines. A rank that finishes cleanly says so first, and is
not waited for."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

BEAT_S = 5.0
STALE_AFTER_S = 120.0
STALE_EXIT = 3
_PREFIX = "ragen/heartbeat/"


def stale_after_s() -> float:
    raw = os.environ.get("RAGEN_RANK_STALE_S")
    if raw is None:
        return STALE_AFTER_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"RAGEN_RANK_STALE_S={raw!r} is not a number of seconds") from None
    if value <= BEAT_S:
        raise ValueError(f"RAGEN_RANK_STALE_S={raw} must exceed the heartbeat interval ({BEAT_S} s)")
    return value


def _exit_naming(rank: int, stale: int, quiet_s: float) -> None:
    print(f"rank {rank}: rank {stale} stopped answering (no heartbeat for {quiet_s:.0f} s: hung, stopped or gone); "
          f"ending this rank so the launch stops. Completed iterations are kept: relaunch the same command to "
          f"resume", file=sys.stderr, flush=True)
    os._exit(STALE_EXIT)


class Watchdog:
    """This rank's heartbeat and its watch over the other ranks (``start`` / ``finish``)."""

    def __init__(self, store: Any, rank: int, world: int, *, beat_s: float = BEAT_S,
                 stale_after: float | None = None, on_stale: Callable[[int, int, float], None] = _exit_naming,
                 clock: Callable[[], float] = time.monotonic) -> None:
        import torch.distributed as dist

        self.store = dist.PrefixStore(_PREFIX, store)
        self.rank, self.world, self.beat_s = rank, world, beat_s
        self.stale_after = stale_after_s() if stale_after is None else stale_after
        self.on_stale, self.clock = on_stale, clock
        self.seen: dict[int, tuple[int, float]] = {}  # rank -> (its counter, when it last moved, by our clock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> list[tuple[int, float]]:
        """One beat: bump this rank's counter, read the others'; returns the ranks quiet for too long, with how
        long (and calls ``on_stale`` for the first)."""
        self.store.add(str(self.rank), 1)
        now, stale = self.clock(), []
        for r in range(self.world):
            if r == self.rank or self.store.check([f"{r}/done"]):
                continue
            count = self.store.add(str(r), 0)
            last = self.seen.get(r)
            if last is None or count != last[0]:
                self.seen[r] = (count, now)
            elif now - last[1] > self.stale_after:
                stale.append((r, now - last[1]))
        if stale:
            self.on_stale(self.rank, *stale[0])
        return stale

    def start(self) -> Watchdog:
        self.check()

        def run() -> None:
            while not self._stop.wait(self.beat_s):
                self.check()

        self._thread = threading.Thread(target=run, name=f"ragen-heartbeat-{self.rank}", daemon=True)
        self._thread.start()
        return self

    def finish(self) -> None:
        """This rank is done (cleanly or with its own error): the others stop waiting for its heartbeat."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.store.set(f"{self.rank}/done", "1")


def separate_client(store: Any) -> Any:
    """A store connection of the heartbeat thread's own when ``store`` is (a prefix over) a TCP store, so the
    thread never shares a socket with the rank's main thread; an in-process store is shared as it is."""
    import torch.distributed as dist

    base = store
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    if isinstance(base, dist.TCPStore):
        return dist.TCPStore(base.host, base.port, is_master=False, wait_for_workers=False)
    return store
