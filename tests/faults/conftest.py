"""The fault-injection and bad-input suite. Every case declares the faults it injects up front (``@declares``,
tests/ledger.py) and takes each one from the ``fault`` fixture while it runs; the ledger (tests/ledger.py) counts
what was tried, survived and lost, and prints the counts at the end of the session."""

from __future__ import annotations

import ledger
import pytest


def pytest_configure(config):
    ledger.register(config)  # also registered by tests/conftest.py; here for a suite run on its own


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """The final metrics and weights of the uninterrupted reference run (tests/faults/uninterrupted.py)."""
    from uninterrupted import train_reference

    return train_reference(tmp_path_factory.mktemp("reference"))


@pytest.fixture
def fault(request):
    """``fault(name)``: the declared fault ``name`` of this test (``@declares``), to guard files with."""
    declared = getattr(request.node, "faults", {})

    def take(name: str) -> ledger.Fault:
        if name not in declared:
            pytest.fail(f"fault {name!r} is not declared: add it to the test's @declares (tests/ledger.py); "
                        f"declared: {sorted(declared)}")
        return declared[name]

    return take
