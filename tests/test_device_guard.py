"""The GPU-placement guard of CI (tests/device_guard.py): every op is checked for a tensor the project built without
placing it beside a model's weights, which a GPU run would refuse. Here the guard itself, and the update failing
under it when a tensor is left behind; the whole GPU check (the loop, its resume, ZeRO-2 and SFT) runs under it in
tests/test_gpu_check.py."""

import sys
from pathlib import Path

import pytest
import torch
from device_guard import Unplaced, UnplacedTensors

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402


@pytest.mark.unit
def test_the_guard_catches_an_unplaced_tensor_and_passes_placed_ones(monkeypatch):
    import device_guard

    monkeypatch.setattr(device_guard, "OWN", (str(Path(__file__).parent) + "/",))  # this file counts as the project's
    lin = torch.nn.Linear(3, 2)
    with UnplacedTensors() as guard:
        x = torch.ones(4, 3)  # no device
        with pytest.raises(Unplaced, match=r"built without a device at tests/test_device_guard\.py:\d+ \(shape "
                                           r"\(4, 3\)\)"):
            lin(x * 2)  # computed from it: still unplaced
        dev = lin.weight.device
        y = lin(x.to(dev))  # moved
        assert (y + torch.ones(2, device=dev)).shape == (4, 2)  # placed where it was built
        assert (y * torch.tensor(3.0)).shape == (4, 2)  # a 0-dim CPU tensor is fine on a GPU too
        idx = torch.tensor([0, 2])
        assert y[idx].shape == (2, 2)  # a CPU index into a GPU tensor is fine
        with pytest.raises(Unplaced):
            y + torch.zeros(4, 2)
        assert guard.checked_ops > 5


def _micro_batch_left_behind(monkeypatch):
    from ragen.train.batch import MicroBatch

    monkeypatch.setattr(MicroBatch, "to", lambda self, device: self)


def _advantages_left_behind(monkeypatch):
    import ragen.train.update as update

    monkeypatch.setattr(update, "_rows", lambda full, mb: full[mb.index, :mb.input_ids.shape[1]])


@pytest.mark.integration
@pytest.mark.parametrize(("breaks", "built_at"), [(_micro_batch_left_behind, r"ragen/train/batch\.py:\d+"),
                                                  (_advantages_left_behind, r"ragen/train/update\.py:\d+")])
def test_the_guard_fails_the_update_when_a_tensor_is_not_moved(tmp_path, monkeypatch, breaks, built_at):
    """Shown failing on purpose: the micro-batch (MicroBatch.to a no-op), or the per-token advantages and old
    log-probs the update keeps on the CPU (``_rows`` without its ``.to``), left where they were built."""
    breaks(monkeypatch)
    with UnplacedTensors(), pytest.raises(Unplaced, match=built_at):
        gpu_check.check_loop(tmp_path / "z0", 0, 1, "check", [0])
