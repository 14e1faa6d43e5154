"""The rollout engine protocol: token ids in, sampled token ids and their logprobs out, weights swapped in place.

Logprobs are those of the distribution the token was drawn from (after temperature / top-p / top-k), so they
are comparable with a trainer that scales its logits by the same temperature."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (end-of-turn sampled) or "length"
    extra: dict = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    name: str

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, *, seed: int,
                 max_new_tokens: Sequence[int] | None = None) -> list[Generation]:
        """One batched call. ``seed`` makes the call repeatable (same prompts, seed and weights give the same
        samples); ``max_new_tokens`` optionally caps each request below ``sampling.max_new_tokens``."""
        ...

    def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Logprob of every token after the first given its prefix (temperature 1): the sync gate's probe."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights in place, without a restart."""
        ...

    def sleep(self) -> None:
        """Give the device's memory to the update (vLLM on a GPU); the next weight sync or call wakes it. A no-op
        for an engine that holds nothing worth freeing."""
        ...

    def close(self) -> None: ...


def clip_requests(max_new_tokens: Sequence[int] | None, n: int, sampling: Sampling) -> list[int]:
    if max_new_tokens is None:
        return [sampling.max_new_tokens] * n
    if len(max_new_tokens) != n:
        raise ValueError(f"got {len(max_new_tokens)} max_new_tokens for {n} prompts")
    caps = [min(int(m), sampling.max_new_tokens) for m in max_new_tokens]
    if any(c < 1 for c in caps):
        raise ValueError("every request needs max_new_tokens >= 1")
    return caps
