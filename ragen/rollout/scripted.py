"""A scripted engine: replays given responses (text or token ids) instead of sampling. For tests of the loop's
bookkeeping and for adversarial model output (garbage, special tokens, overlong answers, empty output)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ragen.rollout.engine import Generation, Sampling, clip_requests

Script = Callable[[int, Sequence[int]], "str | list[int]"]  # (call index, prompt ids) -> response


class ScriptedEngine:
    name = "scripted"

    def __init__(self, tokenizer: Any, script: Script, *, stop_token_id: int | None = None,
                 append_stop: bool = True) -> None:
        self.tokenizer, self.script = tokenizer, script
        self.stop_token_id = tokenizer.eos_token_id if stop_token_id is None else stop_token_id
        self.append_stop = append_stop
        self.calls = 0
        self.log: list[tuple[list[int], list[int]]] = []  # (prompt, returned ids) of every request

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, *, seed: int,
                 max_new_tokens: Sequence[int] | None = None) -> list[Generation]:
        caps = clip_requests(max_new_tokens, len(prompts), sampling)
        out = []
        for p, cap in zip(prompts, caps, strict=True):
            resp = self.script(self.calls, p)
            ids = list(self.tokenizer.encode(resp, add_special_tokens=False)) if isinstance(resp, str) else list(resp)
            if self.append_stop and (not ids or ids[-1] != self.stop_token_id):
                ids.append(self.stop_token_id)
            reason = "stop" if len(ids) <= cap and ids and ids[-1] in sampling.stop_token_ids else "length"
            ids = ids[:cap]
            self.log.append((list(p), ids))
            out.append(Generation(ids, [-1.0] * len(ids), reason))
        self.calls += 1
        return out

    def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return [[-1.0] * (len(s) - 1) for s in sequences]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for _ in named_tensors:
            pass

    def sleep(self) -> None:
        pass

    def close(self) -> None:
        pass
