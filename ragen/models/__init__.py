"""Model and tokenizer locations: local paths, hub ids, and the bundled CPU default."""

from ragen.models.registry import DEFAULT_CPU_MODEL, cache_root, load_tokenizer, resolve_model_path
from ragen.models.smollm2 import prepare_tokenizer

__all__ = ["DEFAULT_CPU_MODEL", "cache_root", "load_tokenizer", "prepare_tokenizer", "resolve_model_path"]
