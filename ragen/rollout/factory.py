"""Build the configured rollout engine for a model."""

from __future__ import annotations

from typing import Any

from ragen.config import Config
from ragen.models import ensure_model
from ragen.models.precision import model_dtype
from ragen.rollout.engine import Engine


def make_renderer(cfg: Config) -> Any:
    """The chat renderer over the run's tokenizer (``model.tokenizer``, default the base model's)."""
    from ragen.agent.chat import ChatRenderer
    from ragen.models import load_tokenizer

    m = cfg.model
    return ChatRenderer(load_tokenizer(m.base, m.tokenizer, m.trust_remote_code), m.end_of_turn_token)


def make_engine(cfg: Config, tokenizer: Any, *, model_path: str | None = None, engine: str | None = None,
                launched: bool = False) -> Engine:
    """``rollout.engine`` (or ``engine``) over ``model_path`` (default: ``model.base``, built once if an alias).
    ``launched``: one vLLM engine of a launch's ranks (rollout/shards.py), over the launcher's process group."""
    path = model_path or ensure_model(cfg.model.base)
    kind = engine or cfg.rollout.engine
    r = cfg.rollout
    if kind == "vllm":
        from ragen.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(path, dtype=model_dtype(cfg), seed=cfg.trainer.seed, max_model_len=r.max_model_len,
                          max_num_batched_tokens=r.max_num_batched_tokens, kv_cache_gib=r.kv_cache_gib,
                          enforce_eager=r.enforce_eager, gpu_memory_utilization=r.gpu_memory_utilization,
                          tensor_parallel_size=r.tensor_parallel_size, enable_prefix_caching=r.enable_prefix_caching,
                          trust_remote_code=cfg.model.trust_remote_code,
                          kv_cache_memory_gib=r.kv_cache_memory_gib, sleep_during_update=r.sleep_during_update,
                          external_launcher=launched)
    if launched:
        raise ValueError(f"rollout.engine={kind!r}: only vLLM engines run on every rank of a launch")
    if kind == "hf":
        from ragen.rollout.hf_engine import HFEngine

        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return HFEngine(path, dtype=model_dtype(cfg), pad_token_id=pad, trust_remote_code=cfg.model.trust_remote_code)
    raise ValueError(f"rollout.engine must be 'vllm' or 'hf', got {kind!r}")
