"""Messages between the ranks of a launch as plain data (ragen/train/wire.py): every kind a run sends comes back
equal, and a message that is not this project's plain data (a planted pickle among them) is refused, never run."""

import builtins
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragen.rollout.engine import Generation, Sampling
from ragen.train import wire
from ragen.train.wire import WireError

pytestmark = pytest.mark.unit

plain = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                     lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(st.text().filter(lambda k: not k.startswith("$")), kids, max_size=4)
                     | st.tuples(kids, kids), max_leaves=20)


@given(plain)
def test_plain_data_comes_back_equal(value):
    assert wire.decode(wire.encode(value)) == value


def test_a_table_the_update_gets_comes_back_equal():
    df = pd.DataFrame({"seed": [3, 4], "score": [0.5, float("nan")], "tag": ["SimpleSokoban", "Bandit"],
                       "tokens": [[1, 2, 3], [4]]})
    back = wire.decode(wire.encode(["update", [df, 7]]))
    assert back[0] == "update" and back[1][1] == 7
    got = back[1][0]
    assert list(got.columns) == list(df.columns) and got["seed"].tolist() == [3, 4]
    assert got["score"].iloc[0] == 0.5 and np.isnan(got["score"].iloc[1])
    assert [list(t) for t in got["tokens"]] == [[1, 2, 3], [4]]


def test_the_engine_calls_classes_paths_and_errors_travel():
    s = Sampling(temperature=0.5, top_p=0.9, top_k=20, max_new_tokens=96, stop_token_ids=(2, 7))
    g = Generation(token_ids=[5, 6], logprobs=[-0.25, -1.5], finish_reason="stop", extra={"n": 1})
    assert wire.decode(wire.encode((s, [g], Path("/runs/a"), np.int64(3)))) == (s, [g], "/runs/a", 3)
    err = wire.decode(wire.encode(KeyError("engine gone")))
    assert isinstance(err, RuntimeError) and str(err) == "KeyError: 'engine gone'"


def test_what_is_not_plain_data_is_refused_when_sent():
    with pytest.raises(WireError, match="a object cannot travel between ranks"):
        wire.encode(object())
    with pytest.raises(WireError, match="keys must be strings"):
        wire.encode({"$table": "x"})
    with pytest.raises(WireError, match="keys must be strings"):
        wire.encode({1: "x"})


class _Planted:
    def __reduce__(self):
        return exec, ("import builtins; builtins._ragen_planted_ran = True",)


def test_a_planted_pickle_is_refused_and_never_run():
    with pytest.raises(WireError, match="not this project's plain data"):
        wire.decode(pickle.dumps(_Planted()))
    assert not hasattr(builtins, "_ragen_planted_ran")


@pytest.mark.parametrize("raw, match", [
    (b'{"$object": {"module": "os", "name": "system"}}', "unknown kind of value '\\$object'"),
    (b'{"$Sampling": {"temperature": 1.0, "__class__": "x"}}', "unknown fields"),
    (b'{"$tuple": [], "x": 1}', "malformed tagged value"),
])
def test_a_forged_message_is_refused(raw, match):
    with pytest.raises(WireError, match=match):
        wire.decode(raw)
