"""Actor (causal LM), critic (same backbone + scalar value head) and the frozen reference model, plus the
forward passes the update needs, aligned per token: position t holds what concerns token t (its logprob under
logits t-1, the value of the state before it); position 0 holds 0 and is never trained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ragen.algos.losses import entropy_from_logits, logprobs_from_logits
from ragen.models.device import compute_device
from ragen.models.registry import torch_dtype


def load_actor(path: str, *, trust_remote_code: bool = False, gradient_checkpointing: bool = False) -> nn.Module:
    """fp32 master weights (mixed precision, if any, comes from the DeepSpeed config)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust_remote_code)
    model.config.use_cache = False
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def load_reference(path: str, *, dtype: str = "bf16", trust_remote_code: bool = False) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code)
    model.eval().requires_grad_(False)
    return model.to(compute_device())  # beside the actor DeepSpeed places there: the batches it scores go there too


class Critic(nn.Module):
    """The actor's backbone with a new scalar value head (fp32, zero-initialised so V starts at 0). The head
    predicts V / value_scale, so a head of unit-size outputs serves returns of any scale."""

    def __init__(self, backbone: nn.Module, hidden_size: int, value_scale: float = 1.0) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_scale = float(value_scale)
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        # in the head's own precision: fp32 weights read fp32 states; DeepSpeed bf16 makes the head bf16 too
        v = self.value_head(h.to(self.value_head.weight.dtype)).float().squeeze(-1)  # (b, L): value after token t
        v = v * self.value_scale
        return torch.nn.functional.pad(v[:, :-1], (1, 0))  # value of the state before token t


def load_critic(path: str, *, trust_remote_code: bool = False, gradient_checkpointing: bool = False,
                value_head: str | Path | None = None, value_scale: float = 1.0) -> Critic:
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust_remote_code)
    backbone.config.use_cache = False
    if gradient_checkpointing:
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    critic = Critic(backbone, backbone.config.hidden_size, value_scale)
    if value_head is not None:
        from safetensors.torch import load_file

        critic.value_head.load_state_dict(load_file(str(value_head)))
    return critic


def bf16_autocast(enabled: bool, device: torch.device | str = "cpu") -> torch.autocast:
    """bf16 autocast of the matmuls on ``device``'s kind (weights, optimizer state and losses stay fp32), or a
    no-op when disabled: 2-3.5x faster forward/backward on a CPU with avx512_bf16, the mixed precision veRL's
    FSDP trains in."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)


def plain_output_layer(model: nn.Module) -> bool:
    """Whether the model's logits are just its output embedding applied to the decoder's last hidden states
    (Llama, Qwen, SmolLM): then the output layer may run on a subset of positions. Models that scale or cap
    their logits (Gemma's softcapping, Cohere's logit_scale) take the whole forward pass."""
    cfg = getattr(model, "config", None)
    return (hasattr(model, "get_decoder") and model.get_output_embeddings() is not None
            and not getattr(cfg, "final_logit_softcapping", None) and getattr(cfg, "logit_scale", None) in (None, 1.0))


def token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False, bf16: bool = False,
                   positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log pi(token t | tokens < t) of a causal LM at ``temperature`` (b, L), position 0 = 0; and the
    entropy of each predictive distribution (same alignment) if asked. ``bf16`` autocasts the forward pass; the
    softmax terms are computed from fp32 logits either way.

    ``positions`` (b, L) bool, e.g. a loss mask: only these tokens' values are needed, so the output layer and
    the softmax over the vocabulary run only where they are predicted, and every other position holds 0. The
    prompt is most of a multi-turn trajectory and the vocabulary projection most of a small model's compute."""
    whole = positions is None or not plain_output_layer(model)
    target = None if whole else (positions.bool() & attention_mask.bool())[:, 1:]  # t + 1 is predicted at t
    with bf16_autocast(bf16, input_ids.device):
        if target is None:
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
        else:
            h = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            logits = model.get_output_embeddings()(h[:, :-1][target])
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    tokens = input_ids[:, 1:] if target is None else input_ids[:, 1:][target]

    def place(values: torch.Tensor) -> torch.Tensor:
        """Back to (b, L): position t + 1 holds what was predicted at t; 0 where nothing was computed."""
        if target is not None:
            values = values.new_zeros(target.shape).masked_scatter(target, values)
        return torch.nn.functional.pad(values, (1, 0))

    return place(logprobs_from_logits(logits, tokens)), place(entropy_from_logits(logits)) if with_entropy else None


def unwrap(model: Any) -> nn.Module:
    """The plain module inside a DeepSpeed engine (or the module itself)."""
    return getattr(model, "module", model)
