"""`make gpu-control` (scripts/gpu_control.py): the model travels to the GPU machine as the GGUF file in two parts,
joined there and checked; the control's settings keep every file it writes in its scratch folder. (The control
itself is `ragen bench learn`'s path, run on the CPU by tests/test_bench_learn.py; `--tiny --allow-cpu` runs it
whole in about two minutes here.)"""

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_control  # noqa: E402

pytestmark = pytest.mark.unit


def test_the_parts_join_into_the_file_and_a_missing_or_damaged_part_is_named(tmp_path):
    src = tmp_path / "model.gguf"
    data = bytes(range(256)) * 41 + b"tail"
    src.write_bytes(data)
    manifest = tmp_path / "a" / "manifest.json"
    one, two = tmp_path / "a" / "part-1", tmp_path / "b" / "part-2"
    record = gpu_control.split_file(src, [(one, 1000), (two, None)], manifest)
    assert one.stat().st_size == 1000 and two.stat().st_size == len(data) - 1000
    assert record["sha256"] == hashlib.sha256(data).hexdigest() and len(record["parts"]) == 2
    joined = gpu_control.join_parts(manifest, tmp_path / "out", root=tmp_path)
    assert joined.name == "model.gguf" and joined.read_bytes() == data
    assert gpu_control.join_parts(manifest, tmp_path / "out", root=tmp_path) == joined  # a checked copy is kept

    two.write_bytes(b"x" + two.read_bytes()[1:])
    with pytest.raises(ValueError, match=r"part 2 of model.gguf .*part-2\) is damaged"):
        gpu_control.join_parts(manifest, tmp_path / "again", root=tmp_path)
    two.unlink()
    with pytest.raises(FileNotFoundError, match=r"part 2 of model.gguf is missing: .*part-2\. Part 1 travels"):
        gpu_control.join_parts(manifest, tmp_path / "again", root=tmp_path)
    assert list((tmp_path / "again").iterdir()) == []  # nothing half-joined is left behind
    with pytest.raises(FileNotFoundError, match="make gpu-bundle"):
        gpu_control.join_parts(tmp_path / "none.json", tmp_path / "again", root=tmp_path)


def test_split_refuses_parts_that_hold_less_than_the_file(tmp_path):
    src = tmp_path / "f"
    src.write_bytes(b"0123456789")
    with pytest.raises(ValueError, match="the parts hold less than the file"):
        gpu_control.split_file(src, [(tmp_path / "p1", 4)], tmp_path / "m.json")


def test_the_gguf_file_can_be_given_by_path(tmp_path, monkeypatch):
    from ragen.models.smollm2 import GGUF_ENV, gguf_path

    f = tmp_path / "SmolLM2.gguf"
    monkeypatch.setenv(GGUF_ENV, str(f))
    with pytest.raises(FileNotFoundError, match=f"{GGUF_ENV}=.*: no such file"):
        gguf_path()
    f.write_bytes(b"GGUF")
    assert gguf_path() == f


def test_the_control_writes_only_in_its_scratch_folder_and_keeps_the_cpu_controls_settings(tmp_path):
    from ragen.config import load_config

    cfg = load_config(ROOT / "params.yaml", ["cpu-sokoban"], gpu_control.control_overrides(tmp_path, tiny=False))
    assert Path(cfg.sft.output).is_relative_to(tmp_path) and Path(cfg.sft.demos).is_relative_to(tmp_path)
    assert cfg.model.base == "smollm2-135m-instruct" and cfg.rollout.engine == "hf"
    assert cfg.envs.train_seeds == [gpu_control.SEED] and cfg.envs.train.n_groups == [2]
    assert cfg.envs.train.group_size == 8 and cfg.algorithm.adv_estimator == "gae"
    assert cfg.trainer.critic_warmup == 2 and cfg.eval.pass_k == 64 and cfg.agent.max_turn == 5
    panel = json.loads(gpu_control.write_panel(tmp_path).read_text())
    assert panel["seeds"] == {"SimpleSokoban": [gpu_control.SEED]}
    tiny = load_config(ROOT / "params.yaml", ["cpu-sokoban"], gpu_control.control_overrides(tmp_path, tiny=True))
    assert tiny.model.base == "tiny-random-llama" and Path(tiny.sft.output).is_relative_to(tmp_path)


def test_gpu_control_refuses_a_machine_without_cuda_unless_asked(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_control.main([]) == 2
    assert "--allow-cpu" in capsys.readouterr().err
