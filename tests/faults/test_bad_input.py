"""Bad input and broken storage through `ragen train` (in-process, tiny model, plain calls): every case stops
with exit code 1 or 2 and one message naming the file or setting and the fix, and never touches the completed
iterations of the run."""

import errno
import shutil

import pytest
from filesystems import tmpfs_mountable
from ledger import declares
from typer.testing import CliRunner
from uninterrupted import train_command

from cli.main import app
from ragen.models import TINY_MODEL, ensure_model


def train(tmp_path, *extra, iterations=2, run="r"):
    return CliRunner().invoke(app, train_command(tmp_path, run, "trainer.checkpoint_every=1", *extra,
                                                 iterations=iterations)[1:])


@pytest.mark.parametrize("args, expected", [
    (["--preset", "cpu-smal"], "unknown preset 'cpu-smal' (did you mean 'cpu-small'"),
    (["--set", "actor.lr=fast"], "actor.lr"),
    (["--set", "actor.lrr=1e-6"], "unknown key 'actor.lrr' (did you mean 'actor.lr'"),
    (["--set", "algorithm.filter_ratio=0.25", "--set", "envs.train.n_groups=[4]", "--set", "envs.train.group_size=2",
      "--set", "actor.ppo_mini_batch_size=4"], "keeps 2 of 8 trajectories"),
    (["--set", "trainer.total_training_steps=-3"], "trainer.total_training_steps"),
    (["--run", "../elsewhere"], "plain folder name"),
])
@declares(("bad input: {args}", "input"))
def test_bad_settings_are_refused_naming_the_field(tmp_path, fault, args, expected):
    fault(f"bad input: {' '.join(args)}")
    r = CliRunner().invoke(app, ["train", "--no-prefect", "--preset", "cpu-small", "--set",
                                 f"trainer.run_dir={tmp_path}", *args])
    assert r.exit_code == 2, r.output
    assert expected in r.output
    assert not any(tmp_path.glob("*/iter_*")), "nothing may be trained on refused settings"


@pytest.mark.slow
@declares("missing model files")
def test_missing_model_files_are_named(tmp_path, fault):
    fault("missing model files")
    broken = tmp_path / "model"
    shutil.copytree(ensure_model(TINY_MODEL), broken)
    for w in broken.glob("*.safetensors"):
        w.unlink()
    r = train(tmp_path, f"model.base={broken}")
    assert r.exit_code == 2, r.output
    assert f"model.base '{broken}' has config.json but no weights" in r.output
    r = train(tmp_path, f"model.base={tmp_path / 'nowhere'}", run="r2")
    assert r.exit_code == 2 and "neither an existing directory nor a reachable hub id" in r.output


# where a tmpfs mounts, test_real_storage.py fills a real one; the patched writer stands in only where none can
SIMULATED_FULL = not tmpfs_mountable()


@pytest.mark.slow
@declares(*[("write failure (disk full) on the run directory", "simulated")] * SIMULATED_FULL, "corrupted checkpoint")
def test_disk_full_then_corrupted_checkpoint(tmp_path, monkeypatch, fault):
    import pandas as pd

    run = tmp_path / "r"
    if SIMULATED_FULL:
        full = fault("write failure (disk full) on the run directory")  # a patched writer raises ENOSPC
        real = pd.DataFrame.to_parquet

        def no_space(df, where, *a, **k):  # the disk fills up as iteration 1 writes its first table
            if "iter_00001" in str(where):
                raise OSError(errno.ENOSPC, "No space left on device", str(where))
            return real(df, where, *a, **k)

        monkeypatch.setattr(pd.DataFrame, "to_parquet", no_space)
        r = train(tmp_path)
        assert r.exit_code == 1, r.output
        assert "No space left on device" in r.output and "iterations 0..0 are complete and intact" in r.output
        assert "it resumes at iteration 1" in r.output
        full.guard(run)
        monkeypatch.setattr(pd.DataFrame, "to_parquet", real)  # space freed: the same command carries on
        r = train(tmp_path)
        assert r.exit_code == 0 and "completed iterations 1..1" in r.output, r.output
        assert full.lost_now() == []
    else:
        r = train(tmp_path)
        assert r.exit_code == 0, r.output

    damaged = fault("corrupted checkpoint")
    damaged.guard(run)
    st = run / "checkpoints" / "iter_00001" / "actor" / "model.safetensors"
    st.write_bytes(st.read_bytes()[:1000])
    r = train(tmp_path, iterations=3)
    assert r.exit_code == 2, r.output
    assert "checkpoints/iter_00001" in r.output and "cannot be loaded" in r.output
    assert "the last good iteration is 0" in r.output
    assert damaged.lost_now() == []
