"""Plain data for the messages between the ranks of a launch (train/ranks.py): JSON, with tables as Parquet and a
closed list of the project's own value classes. Decoding builds nothing but containers, numbers, strings, tables
and those classes, so whoever reaches the launch's key-value store can garble a run but cannot run code on its
ranks, as a pickle would let them (docs/threat-model.md)."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from pathlib import PurePath
from typing import Any

import numpy as np
import pandas as pd

from ragen.rollout.engine import Generation, Sampling

# the classes a message may carry, by name; anything else is refused when encoding (a bug here, not an attack)
_CLASSES: dict[str, type] = {"Sampling": Sampling, "Generation": Generation}
_TAG = "$"  # tagged objects are {"$<kind>": payload}; a plain dict keyed so would be ambiguous and is refused


class WireError(ValueError):
    """A value that is not plain data, or a message that is not one this module wrote."""


def encode(value: Any) -> bytes:
    return json.dumps(_plain(value), separators=(",", ":")).encode()


def decode(raw: bytes) -> Any:
    try:
        tree = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"a launch message that is not this project's plain data ({e}); someone other than the "
                        f"launch's ranks wrote to its store, or the ranks run different versions") from None
    return _value(tree)


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, PurePath):
        return str(v)
    if isinstance(v, tuple):
        return {_TAG + "tuple": [_plain(x) for x in v]}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, dict):
        bad = [k for k in v if not isinstance(k, str) or k.startswith(_TAG)]
        if bad:
            raise WireError(f"dict keys {bad[:3]} cannot travel between ranks: keys must be strings not starting "
                            f"with {_TAG!r}")
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, pd.DataFrame):
        buf = io.BytesIO()
        v.to_parquet(buf, index=False)
        return {_TAG + "table": base64.b64encode(buf.getvalue()).decode()}
    if isinstance(v, BaseException):  # a follower's failure: its text, raised again on rank 0
        return {_TAG + "error": f"{type(v).__name__}: {v}"}
    name = type(v).__name__
    if dataclasses.is_dataclass(v) and _CLASSES.get(name) is type(v):
        return {_TAG + name: {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    raise WireError(f"a {type(v).__qualname__} cannot travel between ranks: only plain data, tables and "
                    f"{sorted(_CLASSES)} do (ragen/train/wire.py)")


def _value(t: Any) -> Any:
    if isinstance(t, list):
        return [_value(x) for x in t]
    if not isinstance(t, dict):
        return t
    tagged = [k for k in t if k.startswith(_TAG)]
    if not tagged:
        return {k: _value(x) for k, x in t.items()}
    if len(t) != 1:
        raise WireError(f"a launch message with a malformed tagged value (keys {sorted(t)[:4]})")
    kind, payload = tagged[0][len(_TAG):], t[tagged[0]]
    if kind == "tuple" and isinstance(payload, list):
        return tuple(_value(x) for x in payload)
    if kind == "table" and isinstance(payload, str):
        return pd.read_parquet(io.BytesIO(base64.b64decode(payload, validate=True)))
    if kind == "error" and isinstance(payload, str):
        return RuntimeError(payload)
    cls = _CLASSES.get(kind)
    if cls is not None and isinstance(payload, dict):
        names = {f.name for f in dataclasses.fields(cls)}
        if set(payload) - names:
            raise WireError(f"a launch message's {kind} has unknown fields {sorted(set(payload) - names)}")
        return cls(**{k: _value(x) for k, x in payload.items()})
    raise WireError(f"a launch message with an unknown kind of value {tagged[0]!r}; only plain data, tables, "
                    f"errors and {sorted(_CLASSES)} travel between ranks")
