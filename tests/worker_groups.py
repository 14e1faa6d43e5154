"""How the suite splits over pytest-xdist workers (`make test` runs it on two with `--dist loadgroup`): which tests
must share a worker (tests/conftest.py marks each test with its group, tests/test_xdist_groups.py checks that the
groups hold), and each worker's share of the cores."""

import os

# session fixtures that train a run: under pytest-xdist (`make test`) the tests sharing one go to one worker
# (--dist loadgroup), so each is trained once, not once per worker
SHARED_RUNS = ("reference_run", "one_process_run")


def xdist_group(item) -> str | None:
    """The tests that must share a worker: those of a session run (``SHARED_RUNS``), else those of a module-scoped
    fixture (the grid's `dvc repro`, the one-rank update), which a second worker would build again."""
    names = getattr(item, "fixturenames", ())
    shared = [n for n in SHARED_RUNS if n in names]
    if shared:
        return shared[0]
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    module = sorted(n for n, d in defs.items() if n in names and d and d[-1].scope == "module")
    return f"{item.path.name}::{'+'.join(module)}" if module else None


def share_cores(environ: dict) -> int | None:
    """Give this xdist worker its share of the CPU: ``OMP_NUM_THREADS`` = usable cores // workers (at least 1), for
    the worker and every process it starts. Unset, each process of each worker takes every core, and on a 2-core
    machine two workers' PyTorch thread pools spin against each other (two tiny runs side by side: 32-35 s with
    2 threads each, 18-24 s with 1). Keeps a value the caller set; None outside a multi-worker session."""
    workers = int(environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1 or "OMP_NUM_THREADS" in environ:
        return None
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    environ["OMP_NUM_THREADS"] = str(threads)
    return threads
