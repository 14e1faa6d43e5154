"""Model FLOPs of the update's passes, from the architecture and the real token counts, and the machine's matrix
throughput in the model's own shapes: together they give the update's MFU (model FLOPs utilisation).

Counted is the work the math needs, not the work a kernel happens to do: every linear layer of the decoder at
every real token (2 FLOPs per weight per token forward), causal attention (QK^T and AV over the tokens before
each token), and the output layer only where a log-probability is read (the value head wherever a value is).
Padding, norms, activations and the optimizer are not model FLOPs. A backward pass counts twice its forward."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Architecture:
    """What the FLOP count needs of a decoder-only transformer."""

    layer_weights: int  # weights of the decoder layers' matrices (attention projections + MLP), all layers
    layers: int
    attention_width: int  # heads x head dim (the width of QK^T and AV)
    hidden: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, model: nn.Module) -> Architecture:
        """Read from a transformers model (a causal LM, or the backbone of a critic)."""
        cfg = model.config
        layers_module = model.layers if hasattr(model, "layers") else model.get_decoder().layers
        weights = sum(p.numel() for p in layers_module.parameters() if p.dim() == 2)
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return cls(weights, cfg.num_hidden_layers, heads * head_dim, cfg.hidden_size, cfg.intermediate_size,
                   cfg.vocab_size)

    def forward_flops(self, lengths: Sequence[int], outputs: int, head_width: int) -> float:
        """One forward pass over sequences of ``lengths`` real tokens, with the output head (``head_width``
        outputs per position: the vocabulary, or 1 for a value head) at ``outputs`` positions."""
        tokens = float(sum(lengths))
        attention = sum(4.0 * self.attention_width * self.layers * n * (n + 1) / 2 for n in lengths)
        return 2.0 * self.layer_weights * tokens + attention + 2.0 * self.hidden * head_width * outputs


def pass_flops(arch: Architecture, lengths: Sequence[int], outputs: int, *, head_width: int,
               backward: bool) -> float:
    """A forward pass, or a forward + backward pass (3x: the backward computes input and weight gradients)."""
    return arch.forward_flops(lengths, outputs, head_width) * (3.0 if backward else 1.0)


def lora_pass_flops(arch: Architecture, lengths: Sequence[int], outputs: int, *, head_width: int, backward: bool,
                    adapter_weights: int, head_trained: bool) -> float:
    """A pass of a LoRA-adapted model, counting what is actually computed: the adapters (``adapter_weights``
    weights of the A and B matrices, 2 FLOPs each per token forward) train fully (3x), the frozen matrices'
    backward computes input gradients only (1x their forward, not 2x), attention has no weights and its
    backward stays 2x; the output head is trained (3x: a value head) or frozen (2x: the actor's output layer)."""
    tokens = float(sum(lengths))
    linear = 2.0 * arch.layer_weights * tokens
    attention = arch.forward_flops(lengths, 0, head_width) - linear
    head = 2.0 * arch.hidden * head_width * outputs
    adapters = 2.0 * adapter_weights * tokens
    forward = linear + attention + head + adapters
    if not backward:
        return forward
    return forward + linear + 2.0 * attention + (2.0 if head_trained else 1.0) * head + 2.0 * adapters


def model_shapes(arch: Architecture, tokens: int, outputs: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of the model's matrix products for a micro-batch of ``tokens`` tokens, ``outputs`` of them
    through the output layer: attention projection, MLP up and down, output layer."""
    return [(tokens, arch.hidden, arch.attention_width), (tokens, arch.hidden, arch.intermediate),
            (tokens, arch.intermediate, arch.hidden), (max(outputs, 1), arch.hidden, arch.vocab)]


def matmul_tflops(shapes: Sequence[tuple[int, int, int]], dtype: torch.dtype, *, seconds: float = 0.5,
                  device: str | torch.device = "cpu") -> dict[str, float]:
    """Measured TFLOP/s of ``a @ b`` in each shape ("m x k x n"), each timed for about ``seconds`` after a
    warm-up, on ``device`` (the CPU: on the threads torch uses now; a GPU: synchronized before each clock read,
    as its kernels run asynchronously)."""
    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    out = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k, device=dev).to(dtype), torch.randn(k, n, device=dev).to(dtype)
        a @ b  # warm-up: packing buffers, thread pool, kernel selection
        sync()
        reps, t0 = 0, time.perf_counter()
        while True:
            a @ b
            reps += 1
            sync()
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds and reps >= 3:
                break
        out[f"{m}x{k}x{n}"] = 2.0 * m * k * n * reps / elapsed / 1e12
    return out
