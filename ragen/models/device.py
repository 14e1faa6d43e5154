"""Where models and their inputs live: the process's GPU when there is one (``cuda:LOCAL_RANK`` under a launcher),
else the CPU. Batches are built on the CPU and moved to the device of the model that consumes them."""

from __future__ import annotations

import os
from typing import Any

import torch


def compute_device() -> torch.device:
    """The device this process computes on: its launcher rank's GPU, or the CPU where CUDA is absent."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def device_of(model: Any) -> torch.device:
    """Where a model (or the module inside a DeepSpeed engine) keeps its weights: its inputs are moved there."""
    p = next(getattr(model, "module", model).parameters(), None)
    return p.device if p is not None else torch.device("cpu")
