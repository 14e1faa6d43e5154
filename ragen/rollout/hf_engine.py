"""HF transformers ``generate`` as a rollout engine: the reference implementation and the fallback where vLLM
is not installed. Left-padded batches; logprobs from the processed scores (the distribution sampled from)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ragen.models.device import compute_device, device_of
from ragen.models.registry import torch_dtype
from ragen.rollout.engine import Generation, Sampling, clip_requests


class HFEngine:
    name = "hf"

    def __init__(self, model_path: str, *, dtype: str = "bf16", pad_token_id: int, batch_size: int = 64,
                 trust_remote_code: bool = False, model: Any = None) -> None:
        from transformers import AutoModelForCausalLM

        self.model = model if model is not None else AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code).to(compute_device())
        self.model.eval()
        self.pad_token_id = int(pad_token_id)
        self.batch_size = batch_size

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, *, seed: int,
                 max_new_tokens: Sequence[int] | None = None) -> list[Generation]:
        caps = clip_requests(max_new_tokens, len(prompts), sampling)
        out: list[Generation] = []
        dev = device_of(self.model)  # sampling draws from this device's generator: fork and seed that one
        with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            for start in range(0, len(prompts), self.batch_size):
                chunk = prompts[start:start + self.batch_size]
                out.extend(self._generate(chunk, sampling, caps[start:start + self.batch_size]))
        return out

    def _generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, caps: list[int]) -> list[Generation]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            attn[i, width - len(p):] = 1
        dev = device_of(self.model)
        ids, attn = ids.to(dev), attn.to(dev)
        kwargs: dict[str, Any] = {"do_sample": not sampling.greedy, "max_new_tokens": max(caps),
                                  "pad_token_id": self.pad_token_id, "return_dict_in_generate": True,
                                  "output_scores": True, "eos_token_id": list(sampling.stop_token_ids) or None}
        if not sampling.greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=sampling.top_k if sampling.top_k > 0 else 0)
        res = self.model.generate(input_ids=ids, attention_mask=attn, **kwargs)
        new = res.sequences[:, width:]
        # scores are the processed logits each token was sampled from; filtered-out entries are -inf
        logp = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in res.scores], dim=1)
        chosen = logp.gather(-1, new[:, :logp.shape[1]].unsqueeze(-1)).squeeze(-1)
        stops = set(sampling.stop_token_ids)
        gens = []
        for i, cap in enumerate(caps):
            toks = new[i].tolist()[:cap]
            reason = "length"
            for j, t in enumerate(toks):
                if t in stops:
                    toks, reason = toks[:j + 1], "stop"
                    break
            gens.append(Generation(toks, chosen[i, :len(toks)].tolist(), reason))
        return gens

    @torch.no_grad()
    def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return sequence_logprobs(self.model, sequences, self.pad_token_id)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_named_tensors(self.model, named_tensors)

    def sleep(self) -> None:
        """Nothing to free: the HF engine's model is its weights."""

    def close(self) -> None:
        self.model = None


@torch.no_grad()
def sequence_logprobs(model: Any, sequences: Sequence[Sequence[int]], pad_token_id: int,
                      batch_size: int = 16) -> list[list[float]]:
    """Temperature-1 logprob of tokens 1..n-1 of each sequence under ``model`` (right padding), in fp32."""
    out: list[list[float]] = []
    dev = device_of(model)
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start:start + batch_size]
        width = max(len(s) for s in chunk)
        ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, s in enumerate(chunk):
            ids[i, :len(s)] = torch.tensor(list(s), dtype=torch.long)
            attn[i, :len(s)] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        logits = model(input_ids=ids, attention_mask=attn).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).cpu()
        out.extend(logp[i, :len(s) - 1].tolist() for i, s in enumerate(chunk))
    return out


def load_named_tensors(model: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy tensors into a model's parameters/buffers by name; unknown names or shape mismatches raise."""
    state = model.state_dict()
    n = 0
    for name, tensor in named_tensors:
        if name not in state:
            raise KeyError(f"weight {name!r} is not in the engine's model")
        if state[name].shape != tensor.shape:
            raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, the engine expects "
                             f"{tuple(state[name].shape)}")
        state[name].copy_(tensor)
        n += 1
    if n == 0:
        raise ValueError("no weights were given")
    return n
