"""Which precision bf16 settings run in on this machine.

A bf16 matmul is fast only where the hardware multiplies bf16 natively (CUDA GPUs from Ampere on; x86 CPUs with
AVX512-BF16 or AMX). Elsewhere torch and vLLM's CPU build emulate it: measured on a 2-core AVX2 EPYC, a bf16
``F.linear`` ran 5.7x slower than fp32 and a bf16 vLLM engine sampled 21 tokens/s against 103 in fp32. There,
``model.emulated_bf16=fp32`` (the default) runs bf16 settings (``model.dtype``, ``actor/critic/sft.compute_dtype``)
in fp32, which loses no precision; ``keep`` runs them in bf16 anyway."""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger(__name__)


@functools.cache
def native_bf16() -> bool:
    """True where bf16 matmuls run in hardware: a CUDA device that supports bf16, or a CPU with AVX512-BF16/AMX."""
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def effective_dtype(requested: str, emulated_bf16: str = "fp32", *, what: str = "model.dtype") -> str:
    """``requested`` (bf16 / fp16 / fp32) as it runs here: bf16 becomes fp32 where the hardware would emulate it
    and ``emulated_bf16`` is fp32 (a warning says so once per setting)."""
    if requested != "bf16" or emulated_bf16 == "keep" or native_bf16():
        return requested
    _warn_once(what)
    return "fp32"


@functools.cache
def _warn_once(what: str) -> None:
    import torch

    log.warning("%s=bf16 runs in fp32 here: this %s has no native bf16 matmul (torch would emulate it, ~5x slower). "
                "Set model.emulated_bf16=keep to run bf16 anyway.",
                what, "GPU" if torch.cuda.is_available() else f"CPU ({torch.backends.cpu.get_cpu_capability()})")


def hardware() -> str:
    """A short name of what computes here, for run tags: the GPU's name, or the CPU's vector ISA."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu-{torch.backends.cpu.get_cpu_capability().lower()}" + ("-bf16" if native_bf16() else "")


def model_dtype(cfg: Any) -> str:
    """``model.dtype`` as the rollout engine and the reference model run it here."""
    return effective_dtype(cfg.model.dtype, cfg.model.emulated_bf16, what="model.dtype")


def runs_bf16(cfg: Any, section: str) -> bool:
    """Whether ``<section>.compute_dtype`` (actor, critic, sft) autocasts to bf16 here."""
    requested = getattr(cfg, section).compute_dtype
    return effective_dtype(requested, cfg.model.emulated_bf16, what=f"{section}.compute_dtype") == "bf16"


def precision_tags(cfg: Any) -> dict[str, str]:
    """Run tags that say what a run computed in on this machine (a bf16 setting may have run in fp32 here)."""
    return {"hardware": hardware(), "engine_dtype": model_dtype(cfg),
            "update_dtype": "bf16" if runs_bf16(cfg, "actor") else "fp32",
            "critic_update_dtype": "bf16" if runs_bf16(cfg, "critic") else "fp32"}
