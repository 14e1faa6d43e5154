"""Model and tokenizer locations: local paths, hub ids, the bundled CPU default and the tiny test model."""

from ragen.models.registry import (
    DEFAULT_CPU_MODEL,
    TINY_MODEL,
    cache_root,
    ensure_model,
    load_tokenizer,
    resolve_model_path,
)
from ragen.models.smollm2 import prepare_model, prepare_tokenizer

__all__ = ["DEFAULT_CPU_MODEL", "TINY_MODEL", "cache_root", "ensure_model", "load_tokenizer", "prepare_model",
           "prepare_tokenizer", "resolve_model_path"]
