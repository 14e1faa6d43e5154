"""Where models live: ``model.base`` is a local path, a hub id, or the alias of the bundled CPU model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DEFAULT_CPU_MODEL = "smollm2-135m-instruct"
CACHE_ENV = "RAGEN_CACHE_DIR"


def cache_root() -> Path:
    """``$RAGEN_CACHE_DIR`` or ``~/.cache/ragen``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "ragen").expanduser()


def resolve_model_path(base: str) -> str:
    """The path or hub id that transformers/vLLM load for ``base``."""
    if base == DEFAULT_CPU_MODEL:
        return str(cache_root() / "models" / DEFAULT_CPU_MODEL)
    return base


def load_tokenizer(base: str, tokenizer: str | None = None, trust_remote_code: bool = False) -> Any:
    """Tokenizer for a model. The bundled model's tokenizer is extracted from its GGUF file on first use."""
    from transformers import AutoTokenizer

    name = tokenizer or base
    path = resolve_model_path(name)
    if name == DEFAULT_CPU_MODEL:
        from ragen.models.smollm2 import prepare_tokenizer

        prepare_tokenizer(Path(path))
    elif not Path(path).exists() and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise FileNotFoundError(f"model.tokenizer/model.base {name!r} is not a local path and HF_HUB_OFFLINE=1")
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
