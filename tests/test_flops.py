"""Model FLOPs of the update's passes (the MFU of `ragen bench train` divides by them), by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ragen.config import load_config
from ragen.train.batch import Sequences
from ragen.train.flops import Architecture, lora_pass_flops, matmul_tflops, model_shapes, pass_flops
from ragen.train.update_bench import update_flops

pytestmark = pytest.mark.unit


def small_llama(causal_lm: bool = True) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

    # d 8, 2 heads of 4 (attention width 8), 1 kv head, MLP 16, 3 layers, vocabulary 50
    cfg = LlamaConfig(vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=4)
    return LlamaForCausalLM(cfg) if causal_lm else LlamaModel(cfg)


def test_architecture_counts_the_decoder_layers_matrices():
    # per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 + gate/up/down 3 x 8x16 = 64+32+32+64+384 = 576; 3 layers = 1728
    for model in (small_llama(True), small_llama(False)):  # a causal LM, or a critic's backbone
        a = Architecture.of(model)
        assert (a.layer_weights, a.layers, a.attention_width, a.hidden, a.intermediate, a.vocab) == \
            (1728, 3, 8, 8, 16, 50)


def test_forward_and_backward_flops_by_hand():
    a = Architecture.of(small_llama())
    # lengths 2 and 3: 5 tokens x 2 x 1728 = 17280 in the layers; causal attention 4 x 8 x 3 x (1+2 + 1+2+3) = 864
    # (QK^T and AV, 2 FLOPs per multiply-add, over the tokens up to each one); the output layer at 4 positions:
    # 2 x 8 x 50 x 4 = 3200
    assert a.forward_flops([2, 3], outputs=4, head_width=50) == 17280 + 864 + 3200
    assert pass_flops(a, [2, 3], 4, head_width=50, backward=False) == 21344
    assert pass_flops(a, [2, 3], 4, head_width=50, backward=True) == 3 * 21344
    assert a.forward_flops([2, 3], outputs=5, head_width=1) == 17280 + 864 + 80  # a value head at every token


def test_update_flops_count_the_passes_the_update_makes():
    """The actor: one scoring pass and ppo_epochs training passes with the output layer at the trained tokens;
    the critic: values everywhere when scoring, at the trained tokens when training."""
    a = Architecture.of(small_llama())
    seqs = Sequences(input_ids=[np.zeros(2, np.int64), np.zeros(3, np.int64)],
                     loss_mask=[np.array([0, 1], bool), np.array([0, 1, 1], bool)],
                     rewards=[np.zeros(2), np.zeros(3)], turn_ends=[np.zeros(2, bool), np.zeros(3, bool)],
                     scores=np.zeros(2), groups=np.zeros(2, np.int64), tags=["Bandit"] * 2)
    cfg = load_config(None, ["cpu-small"], ["actor.ppo_epochs=2"])
    f = update_flops(seqs, a, cfg)
    body = 17280 + 864
    assert f["actor_scoring"] == body + 2 * 8 * 50 * 3
    assert f["actor_training"] == 2 * 3 * (body + 2 * 8 * 50 * 3)
    assert f["critic_scoring"] == body + 2 * 8 * 5
    assert f["critic_training"] == 3 * (body + 2 * 8 * 3)


def test_matmul_throughput_is_measured_in_the_models_shapes():
    a = Architecture.of(small_llama())
    shapes = model_shapes(a, tokens=32, outputs=4)
    assert shapes == [(32, 8, 8), (32, 8, 16), (32, 16, 8), (4, 8, 50)]
    tf = matmul_tflops(shapes, torch.float32, seconds=0.01)
    assert list(tf) == ["32x8x8", "32x8x16", "32x16x8", "4x8x50"] and all(v > 0 for v in tf.values())


def test_the_peak_is_timed_where_the_update_runs(monkeypatch):
    """On a GPU machine the update runs on CUDA (DeepSpeed's accelerator): its peak is timed there, each clock
    read after a synchronize, not on the CPU (CPU-only here: the device the bench asks for is checked)."""
    from ragen.train import update_bench

    asked = []
    monkeypatch.setattr(update_bench, "matmul_tflops", lambda shapes, dtype, device: asked.append(device) or
                        {"1x1x1": 1.0})
    monkeypatch.setattr(update_bench.torch.cuda, "is_available", lambda: True)
    update_bench.peak_tflops(Architecture.of(small_llama()), ["fp32"])
    monkeypatch.setattr(update_bench.torch.cuda, "is_available", lambda: False)
    update_bench.peak_tflops(Architecture.of(small_llama()), ["fp32"])
    assert asked == ["cuda", "cpu"]


def test_lora_pass_counts_what_is_computed_by_hand():
    """LoRA: frozen matrices backpropagate input gradients only (1x), attention 2x, the adapters 3x; the actor's
    frozen output layer 2x, a trained value head 3x. Lengths 2 and 3 (5 tokens), 100 adapter weights."""
    a = Architecture.of(small_llama())
    layers, attention, adapters = 17280, 864, 2 * 100 * 5
    head = 2 * 8 * 50 * 4  # the output layer at 4 positions
    fwd = layers + attention + head + adapters
    assert lora_pass_flops(a, [2, 3], 4, head_width=50, backward=False, adapter_weights=100,
                           head_trained=False) == fwd == 22344
    assert lora_pass_flops(a, [2, 3], 4, head_width=50, backward=True, adapter_weights=100,
                           head_trained=False) == fwd + layers + 2 * attention + head + 2 * adapters == 46552
    value = 2 * 8 * 1 * 5
    assert lora_pass_flops(a, [2, 3], 5, head_width=1, backward=True, adapter_weights=100, head_trained=True) == \
        (layers + attention + value + adapters) + layers + 2 * attention + 2 * value + 2 * adapters
    # without adapters and with everything trained it would be the full pass; LoRA's backward is cheaper
    assert lora_pass_flops(a, [2, 3], 4, head_width=50, backward=True, adapter_weights=0, head_trained=False) < \
        pass_flops(a, [2, 3], 4, head_width=50, backward=True)
