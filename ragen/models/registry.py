"""Where models live: ``model.base`` is a local path, a hub id, or the alias of a model built locally
(the bundled CPU default, or the tiny random test model)."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_CPU_MODEL = "smollm2-135m-instruct"
TINY_MODEL = "tiny-random-llama"
ALIASES = (DEFAULT_CPU_MODEL, TINY_MODEL)
CACHE_ENV = "RAGEN_CACHE_DIR"


def torch_dtype(name: str) -> Any:
    """``model.dtype`` (bf16 / fp16 / fp32) as a torch dtype."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


@contextmanager
def staged_dir(target: Path, marker: str | None = None) -> Iterator[Path]:
    """A temporary directory beside ``target`` to write into; on success its files move into ``target``, the
    ``marker`` file last (its presence means the directory is complete), so a crash never leaves a
    half-written model or tokenizer."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        yield tmp
        target.mkdir(parents=True, exist_ok=True)
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == marker):
            shutil.move(str(f), target / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cache_root() -> Path:
    """``$RAGEN_CACHE_DIR`` or ``~/.cache/ragen``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "ragen").expanduser()


def resolve_model_path(base: str) -> str:
    """The path or hub id that transformers/vLLM load for ``base``."""
    if base in ALIASES:
        return str(cache_root() / "models" / base)
    return base


def ensure_model(base: str) -> str:
    """Make sure the weights of ``base`` can be loaded (building a local alias once) and return its path/id."""
    path = resolve_model_path(base)
    if base == DEFAULT_CPU_MODEL:
        from ragen.models.smollm2 import prepare_model

        prepare_model(Path(path))
    elif base == TINY_MODEL:
        from ragen.models.tiny import build_tiny_model

        build_tiny_model(Path(path))
    elif Path(path).exists():
        if not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(f"model.base {base!r} is a local path without config.json; point it at a "
                                    f"directory written by save_pretrained (or a checkpoint of this project)")
        if not has_weights(Path(path)):
            raise FileNotFoundError(f"model.base {base!r} has config.json but no weights (*.safetensors or "
                                    f"pytorch_model*.bin); restore the model directory (e.g. `dvc pull`) or "
                                    f"point model.base at a complete one")
    elif not reachable(path):
        raise unreachable("model.base", base)
    return path


HUB_PROBE_S = 5.0  # how long the hub may take to answer before a model that is not here is refused


def looks_like_path(name: str) -> bool:
    """A name a hub id cannot be: it starts as a file system path does."""
    return name.startswith((".", "/", "~"))


def reachable(path: str) -> bool:
    """Whether a name that is not an existing directory can be loaded as a hub id: in the Hugging Face cache, or
    the hub answers for it within ``HUB_PROBE_S`` (never with HF_HUB_OFFLINE=1). Without this, a machine with no
    route to the hub spent ~50 s in the hub client's retries before its error."""
    if looks_like_path(path):
        return False
    return in_hub_cache(path) or (os.environ.get("HF_HUB_OFFLINE") != "1" and hub_has(path) is None)


def in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


@functools.cache
def hub_has(repo_id: str) -> str | None:
    """None when the hub (``HF_ENDPOINT``) lists the model, else why not (unreachable, not found, gated)."""
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    req = urllib.request.Request(f"{endpoint}/api/models/{repo_id}", method="HEAD")
    try:
        with urllib.request.urlopen(req, timeout=HUB_PROBE_S):
            return None
    except urllib.error.HTTPError as e:
        return f"{endpoint} answered {e.code} for it" + (" (not there, or gated)" if e.code in (401, 404) else "")
    except (urllib.error.URLError, OSError) as e:
        return f"{endpoint} could not be reached ({getattr(e, 'reason', e)}; waited up to {HUB_PROBE_S:.0f} s)"


def unreachable(setting: str, name: str) -> FileNotFoundError:
    why = "it is a path" if looks_like_path(name) else \
        "HF_HUB_OFFLINE=1" if os.environ.get("HF_HUB_OFFLINE") == "1" else hub_has(name)
    return FileNotFoundError(f"{setting} {name!r} is neither an existing directory nor a reachable hub id ({why}); "
                             f"use {DEFAULT_CPU_MODEL!r} (built by `ragen models prepare`) or a local path, or "
                             f"download it where the hub answers (`huggingface-cli download {name} --local-dir "
                             f"DIR`) and set {setting.split('/')[0]}=DIR")


def has_weights(path: Path) -> bool:
    """Whether a model directory holds weight files transformers and vLLM load (single or sharded)."""
    return any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))


def load_tokenizer(base: str, tokenizer: str | None = None, trust_remote_code: bool = False) -> Any:
    """Tokenizer for a model. The bundled model's tokenizer is extracted from its GGUF file on first use."""
    from transformers import AutoTokenizer

    name = tokenizer or base
    if name == TINY_MODEL:  # the tiny model shares the bundled tokenizer
        name = DEFAULT_CPU_MODEL
    path = resolve_model_path(name)
    if name == DEFAULT_CPU_MODEL:
        from ragen.models.smollm2 import prepare_tokenizer

        prepare_tokenizer(Path(path))
    elif not Path(path).exists() and not reachable(path):
        raise unreachable("model.tokenizer/model.base", name)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
