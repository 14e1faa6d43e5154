"""A tiny random Llama with the bundled model's tokenizer: fast tests of every code path vLLM and DeepSpeed take."""

from __future__ import annotations

from pathlib import Path

from ragen.models.registry import TINY_MODEL, cache_root, load_tokenizer, staged_dir

MARKER = "ragen-tiny.json"


def tiny_model_path() -> Path:
    return cache_root() / "models" / TINY_MODEL


def build_tiny_model(target: Path | None = None, *, seed: int = 0, tokenizer: str = "smollm2-135m-instruct") -> Path:
    """2 layers, hidden 128, head dim 64 (a size every vLLM attention backend supports), tied embeddings."""
    target = Path(target) if target is not None else tiny_model_path()
    if (target / MARKER).is_file() and any(target.glob("*.safetensors")):  # else rebuilt
        return target
    import json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer(tokenizer)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, rope_theta=10000.0, dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with staged_dir(target, MARKER) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps({"seed": seed, "tokenizer": tokenizer}))
    return target
