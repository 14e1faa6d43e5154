"""The same optimiser without DeepSpeed: torch AdamW + grad-norm clip behind the engine surface the update uses.
The reference that DeepSpeed is measured against (``ragen bench train``) and checked against in tests."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ragen.train.ds import param_groups


class PlainEngine:
    def __init__(self, model: nn.Module, *, lr: float, betas: tuple[float, float], weight_decay: float,
                 grad_clip: float, lr_of: Mapping[str, float] | None = None) -> None:
        self.module = model
        self.optimizer = torch.optim.AdamW(param_groups(model, lr, lr_of), lr=lr, betas=betas,
                                           weight_decay=weight_decay, fused=True)
        self.grad_clip = grad_clip
        self.global_steps = 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        pass

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = False) -> None:
        loss.backward()

    def zero_optimization_stage(self) -> int:
        return 0

    def bfloat16_enabled(self) -> bool:
        return False

    def get_global_grad_norm(self) -> None:
        return None

    def was_step_applied(self) -> bool:
        return True  # the update only steps after checking the norm itself

    def step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_steps += 1
