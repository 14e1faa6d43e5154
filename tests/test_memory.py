"""The ZeRO memory table against hand-computed values (ZeRO paper sec. 3.1: 16 bytes per parameter with Adam)."""

import pytest

from ragen.train.memory import colocated_budget, count_parameters, memory_table, model_alias, model_state_bytes

pytestmark = pytest.mark.unit


def test_model_state_bytes_by_stage_by_hand():
    n = 1_000_000
    assert model_state_bytes(n, 0, 8) == 16e6  # 2 + 2 + 12, nothing sharded
    assert model_state_bytes(n, 1, 4) == n * (2 + 2 + 12 / 4)  # 7e6
    assert model_state_bytes(n, 2, 4) == n * (2 + 14 / 4)  # 5.5e6
    assert model_state_bytes(n, 3, 4) == 4e6
    assert model_state_bytes(n, 2, 1) == model_state_bytes(n, 0, 1)  # one rank: nothing to shard
    assert model_state_bytes(n, 2, 2, mixed=False) == n * (4 + 12 / 2)
    with pytest.raises(ValueError, match="stage"):
        model_state_bytes(n, 4, 1)


def test_table_adds_critic_and_reference():
    rows = {(r.stage, r.world): r for r in memory_table(2**30, worlds=(1, 4), reference=True)}
    assert rows[(0, 1)].actor_gib == 16 and rows[(0, 1)].critic_gib == 16 and rows[(0, 1)].reference_gib == 2
    assert rows[(3, 4)].total_gib == 4 + 4 + 0.5  # ZeRO-3 also shards the frozen reference


def test_parameter_counts_match_the_published_sizes():
    assert count_parameters("qwen2.5-0.5b") == 494_032_768  # Qwen2.5-0.5B: 0.49B (tied embeddings)
    assert round(count_parameters("qwen2.5-7b") / 1e9, 2) == 7.62
    with pytest.raises(FileNotFoundError, match="local model directory"):
        count_parameters("no-such-model")


def test_one_gpu_shared_by_vllm_and_deepspeed_by_hand():
    """2^30 parameters, ZeRO-0, mixed: actor and critic states 16 GiB each; the engine's bf16 weights 2 GiB."""
    n = 2**30
    b = colocated_budget(n, gpu_gib=80, gpu_memory_utilization=0.5, kv_cache_gib=None, sleep_during_update=True,
                         stage=0)
    assert (b["trainer_states_gib"], b["engine_weights_gib"], b["engine_gib"]) == (32, 2, 40)
    assert (b["rollout_phase_gib"], b["rollout_headroom_gib"]) == (72, 8)
    assert (b["update_phase_gib"], b["update_headroom_gib"]) == (32, 48)  # asleep: vLLM holds nothing
    awake = colocated_budget(n, gpu_gib=80, gpu_memory_utilization=0.5, kv_cache_gib=10, sleep_during_update=False,
                             stage=2, world=1, critic=False)
    assert (awake["trainer_states_gib"], awake["engine_gib"], awake["update_phase_gib"]) == (16, 12, 28)


def test_model_alias_of_hub_ids():
    assert model_alias("Qwen/Qwen2.5-0.5B-Instruct") == "qwen2.5-0.5b"
    assert model_alias("Qwen/Qwen2.5-7B-Instruct") == "qwen2.5-7b"
    assert model_alias("/models/mine") == "/models/mine"


def test_a_local_model_is_counted_from_its_safetensors_headers_as_on_the_meta_device():
    from ragen.models import TINY_MODEL, ensure_model
    from ragen.train.memory import count_saved_parameters

    path = ensure_model(TINY_MODEL)
    assert count_saved_parameters(path) == count_parameters(path) > 0
    assert count_saved_parameters("/nonexistent") is None
