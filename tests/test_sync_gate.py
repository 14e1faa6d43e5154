"""The sync gate's calibration: a real bf16 engine (HF) against the fp32 trainer on the tiny model."""

import copy

import pytest
import torch

from ragen.agent.chat import ChatRenderer
from ragen.models import TINY_MODEL, ensure_model, load_tokenizer
from ragen.rollout.hf_engine import HFEngine
from ragen.rollout.sync import DEFAULT_PROBE, SyncGateError, calibrate_gate, gate_tolerance, probe_batch, sync_weights

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("mean_tol,floor,factor,want", [
    (0.15, None, 2.0, 0.15),   # not calibrated: the fixed tolerance
    (0.15, 0.12, 2.0, 0.24),   # an SFT warm-start's floor: 2 x 0.12
    (0.15, 0.06, 2.0, 0.15),   # a base model's floor: 2 x 0.06 = 0.12 < 0.15, the fixed tolerance stays
    (0.01, 1e-5, 2.0, 0.01),   # an fp32 engine: never narrower than the fixed tolerance
    (0.15, 0.12, 0.0, 0.15),   # factor 0: calibration off
])
def test_gate_tolerance(mean_tol, floor, factor, want):
    assert gate_tolerance(mean_tol, floor, factor) == pytest.approx(want)


@pytest.fixture(scope="module")
def tiny():
    path = ensure_model(TINY_MODEL)
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(path)
    trainer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    probe = probe_batch(ChatRenderer(tok), DEFAULT_PROBE)
    return path, trainer, probe, tok.pad_token_id


def perturbed(model, scale: float, seed: int = 0):
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.abs().mean())
    return out


def test_calibrated_gate_passes_a_real_sync_that_a_fixed_tolerance_refuses(tiny):
    path, trainer, probe, pad = tiny
    engine = HFEngine(path, dtype="bf16", pad_token_id=pad)
    floor = calibrate_gate(engine, trainer, probe, pad_token_id=pad, mean_tol=0.15, max_tol=2.5, factor=2.0)
    assert floor.passed and floor.mean_abs > 1e-4  # bf16 vs fp32 is never exact
    # an fp32 update that moves weights off the bf16 grid; the engine holds it after the sync
    updated = perturbed(trainer, 0.01)
    tight = floor.mean_abs / 2  # a fixed tolerance sized below this model's precision floor
    with pytest.raises(SyncGateError, match=r"tolerance .*: rollout\.sync_mean_tol\)"):
        sync_weights(engine, updated.state_dict().items(), updated, probe, pad_token_id=pad, mean_tol=tight,
                     max_tol=2.5)
    report = sync_weights(engine, updated.state_dict().items(), updated, probe, pad_token_id=pad, mean_tol=tight,
                          max_tol=2.5, floor=floor.mean_abs, floor_factor=2.0)
    assert report.passed and report.floor == floor.mean_abs and report.mean_tol == pytest.approx(2 * floor.mean_abs)
    # a sync that loads stale weights is still caught with the widened tolerance
    far = perturbed(trainer, 0.5, seed=1)
    with pytest.raises(SyncGateError, match="calibrated floor"):
        sync_weights(engine, trainer.state_dict().items(), far, probe, pad_token_id=pad, mean_tol=tight,
                     max_tol=2.5, floor=floor.mean_abs, floor_factor=2.0)


def test_calibration_refuses_an_engine_that_holds_other_weights(tiny):
    path, trainer, probe, pad = tiny
    engine = HFEngine(path, dtype="fp32", pad_token_id=pad)
    far = perturbed(trainer, 0.5, seed=2)
    with pytest.raises(SyncGateError, match=r"before any update .* did not load the weights the trainer did"):
        calibrate_gate(engine, far, probe, pad_token_id=pad, mean_tol=0.01, max_tol=0.05, factor=2.0)
    same = calibrate_gate(engine, trainer, probe, pad_token_id=pad, mean_tol=0.01, max_tol=0.05, factor=2.0)
    assert same.mean_abs < 1e-3  # fp32 engine: the floor is kernel rounding only
