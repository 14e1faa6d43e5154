"""Declaring the faults a test injects, up front (``@declares``), so the fault bench counts each one whether or not
it ran: a fault whose test was skipped or deselected shows as ``not tried`` with the reason instead of vanishing.

Kinds: ``real`` (the failure really happens to a real component: a signal, a damaged file, a dead server),
``simulated`` (code pretends it: a patched writer, a scripted engine standing in for the model), ``input`` (bad
arguments or settings given to a command, counted apart from faults)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

KINDS = ("real", "simulated", "input")


def declares(*faults: tuple[str, str] | str) -> pytest.MarkDecorator:
    """``@declares("name", ("other", "simulated"))``: the faults a test injects (kind ``real`` unless given). A
    name may hold ``{param}`` fields of a parametrized test (a list parameter is joined with spaces)."""
    plan = []
    for f in faults:
        name, kind = (f, "real") if isinstance(f, str) else f
        if kind not in KINDS:
            raise ValueError(f"fault kind {kind!r} of {name!r}: one of {KINDS}")
        plan.append((name, kind))
    return pytest.mark.fault_plan(plan)


def planned(item: Any) -> list[tuple[str, str]]:
    """The faults one collected test declares, with its parameters filled in."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    shown = {k: " ".join(map(str, v)) if isinstance(v, list | tuple) else v for k, v in params.items()}
    return [(name.format(**shown), kind) for m in item.iter_markers("fault_plan") for name, kind in m.args[0]]


Declare = Callable[[str], Any]
