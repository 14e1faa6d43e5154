"""`ragen bench train` on the tiny model: the JSON's fields and their arithmetic (the real numbers come from the
real model; docs/benchmarks.md has them)."""

from __future__ import annotations

import math

import pytest

from ragen.models import TINY_MODEL


@pytest.mark.integration
def test_bench_train_reports_peak_flops_and_mfu_per_model_and_batch():
    from ragen.models.precision import native_bf16
    from ragen.train.update_bench import bench_train

    said: list[str] = []
    out = bench_train(model=TINY_MODEL, lora_rank=4, progress=said.append)  # rank 4: small beside the tiny model
    assert out["compute_dtype"] == ("bf16" if native_bf16() else "fp32")  # bf16 where native, the default
    assert out["peak_tflops"]["fp32"] > 0
    assert (out["peak_tflops"]["bf16"] is not None) == native_bf16()
    assert out["peak_tflops"]["fp32"] == max(out["matmul_tflops"]["fp32"].values())
    assert set(out["mfu"]) == {"main/actor", "main/critic", "multiturn/actor", "multiturn/critic"}
    peak = out["peak_tflops"][out["compute_dtype"]]
    for key, mfu in out["mfu"].items():
        batch, who = key.split("/")
        b = out["batches"][batch]
        secs = b["seconds"][f"{who}_scoring"] + b["seconds"][f"{who}_training"]
        flop = b["model_tflop"][f"{who}_scoring"] + b["model_tflop"][f"{who}_training"]
        assert out["achieved_tflops"][key] == pytest.approx(flop / secs)
        assert mfu == pytest.approx(flop / secs / peak) and mfu > 0
    main, multi = out["batches"]["main"], out["batches"]["multiturn"]
    assert main["trajectories"] == 16 and multi["trajectories"] == 8
    assert multi["max_len"] > 3 * main["max_len"]  # several thinking turns against one short answer
    assert main["trained_tokens"] < main["tokens"]
    # the comparisons of the main batch: ratios, and the losses of the same batch in fp32
    for ratio in ("deepspeed_over_plain", "bucketed_over_padded"):
        assert out[ratio] > 0
    assert ("bf16_over_fp32" in out) == (out["compute_dtype"] == "bf16")
    assert set(main["loss_rel_diff"]) == {"rollout/old_log_prob", "actor/entropy_loss", "critic/vf_loss"}
    assert all(math.isfinite(v) for v in main["loss_rel_diff"].values())
    assert any("multiturn" in s for s in said)
    # LoRA on the same batch: its MFU over the FLOPs it computes (fewer than a full update's), and its speed ratio
    lora = out["lora"]
    assert lora["rank"] == 4 and lora["adapter_weights"] > 0
    assert lora["lora_over_full"] == pytest.approx(lora["full_update_s"] / lora["update_s"])
    assert lora["model_tflop"]["actor_training"] < main["model_tflop"]["actor_training"]
    for who in ("actor", "critic"):
        secs = lora["seconds"][f"{who}_scoring"] + lora["seconds"][f"{who}_training"]
        flop = lora["model_tflop"][f"{who}_scoring"] + lora["model_tflop"][f"{who}_training"]
        assert lora["mfu"][who] == pytest.approx(flop / secs / peak) and lora["mfu"][who] > 0


@pytest.mark.unit
def test_bench_train_refuses_an_unknown_batch():
    from typer.testing import CliRunner

    from cli.main import app
    from ragen.train.update_bench import batch_config

    with pytest.raises(ValueError, match="unknown batch 'sokoban'"):
        batch_config("sokoban", TINY_MODEL)
    r = CliRunner().invoke(app, ["bench", "train", "--batch", "sokoban"])
    assert r.exit_code == 2 and "use main and/or multiturn" in r.output
