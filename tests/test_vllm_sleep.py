"""vLLM sharing one GPU with DeepSpeed (issue 27): the engine sleeps for the update and wakes in the order vLLM
needs (weights, the new weights in, then the KV cache, then any forward pass). The calls are checked against a
recording stand-in for ``vllm.LLM``: sleep mode exists only on GPUs, which CI does not have."""

from __future__ import annotations

import pytest
import torch

from ragen.rollout.engine import Sampling
from ragen.rollout.vllm_engine import VLLMEngine

pytestmark = pytest.mark.unit


class RecordingLLM:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str]) -> None:
        self.calls.append(("wake_up", tuple(tags)))

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        self.calls.append((method, [n for n, _ in kwargs["weights_iterator"]]))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))

    def generate(self, requests: list, params: object, use_tqdm: bool = False) -> list:
        self.calls.append(("generate", len(requests)))
        return []


def engine(sleep_mode: bool) -> VLLMEngine:
    e = object.__new__(VLLMEngine)
    e.llm, e.dtype, e.sleep_mode, e.sleeping, e.max_model_len = RecordingLLM(), torch.bfloat16, sleep_mode, False, 64
    e._params = lambda sampling, max_tokens, **extra: None  # type: ignore[method-assign]
    return e


WEIGHTS = [("w", torch.zeros(2))]


def test_sleep_then_sync_wakes_weights_loads_then_wakes_the_cache():
    e = engine(sleep_mode=True)
    e.sleep()
    e.sleep()  # already asleep: no second call
    e.load_weights(WEIGHTS)
    assert e.llm.calls == [("sleep", 1), ("wake_up", ("weights",)), ("reload_weights", ["w"]),
                           ("wake_up", ("kv_cache",)), ("reset_prefix_cache",)]
    assert not e.sleeping


def test_a_forward_pass_on_a_sleeping_engine_wakes_it_first():
    e = engine(sleep_mode=True)
    e.sleep()
    e.generate([[1, 2]], Sampling(temperature=1.0, max_new_tokens=4), seed=0)
    assert e.llm.calls == [("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",)), ("generate", 1)]


def test_without_sleep_mode_nothing_sleeps_and_the_sync_only_reloads():
    e = engine(sleep_mode=False)
    e.sleep()
    e.load_weights(WEIGHTS)
    assert e.llm.calls == [("reload_weights", ["w"]), ("reset_prefix_cache",)]
