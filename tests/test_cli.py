import json

import pytest
from typer.testing import CliRunner

from cli.main import app

pytestmark = pytest.mark.unit

runner = CliRunner()


def test_envs_show_prints_first_turn_prompt():
    res = runner.invoke(app, ["envs", "show", "--tag", "SimpleSokoban", "--seed", "123", "--set",
                              "agent.enable_think=true"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert out.startswith("<|im_start|>system\nYou're a helpful assistant. <|im_end|>")
    assert "Turn 1:\nState:\n" in out and out.rstrip().endswith("<|im_start|>assistant\n<think>")


def test_envs_show_unknown_tag_is_a_clear_error():
    res = runner.invoke(app, ["envs", "show", "--tag", "Sokobon"])
    assert res.exit_code == 2 and "unknown env tag 'Sokobon'" in res.output


def test_bench_envs_json():
    res = runner.invoke(app, ["bench", "envs", "--json", "--seconds", "0.2"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert {"sokoban_rooms_per_s", "larger_sokoban_rooms_per_s", "env_steps_per_s"} <= set(data)
    assert all(v > 0 for v in data.values())


def test_instances_command(tmp_path):
    out = tmp_path / "instances.parquet"
    res = runner.invoke(app, ["envs", "instances", "--out", str(out), "--iteration", "1"])
    assert res.exit_code == 0, res.output
    assert out.is_file() and "wrote 64 instances" in res.output  # cpu-small: 8 groups x 8


def test_config_error_exit_code():
    res = runner.invoke(app, ["config", "show", "--set", "agent.max_turn=zero"])
    assert res.exit_code == 2 and "agent.max_turn = 'zero'" in res.output


def test_rollout_command_with_hf_engine_on_tiny_model(tmp_path):
    from ragen.rollout.table import read_rollouts

    out = tmp_path / "rollouts.parquet"
    args = ["rollout", "--out", str(out), "--engine", "hf", "--json",
            "--set", "model.base=tiny-random-llama", "--set", "envs.train.tags=[Bandit]",
            "--set", "envs.train.n_groups=[2]", "--set", "envs.train.group_size=2",
            "--set", "rollout.response_length=8", "--set", "algorithm.filter_ratio=1.0",
            "--set", "actor.ppo_mini_batch_size=2", "--set", "critic.ppo_mini_batch_size=2",
            "--set", "agent.max_turn=5"]  # cpu-small's Bandit has 1 turn; 5 shows the retry-until-valid loop
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    last = res.output.strip().splitlines()[-1]  # stderr (progress bars) is mixed into the output
    metrics = json.loads(last[last.index("{"):])
    assert metrics["Bandit/format_error_rate"] == 1.0
    assert metrics["rollout/generated_tokens"] == 4 * 8 * 5  # no valid arm: all 5 turns are used
    assert len(read_rollouts(out)) == 4


def test_rollout_command_bad_mode():
    res = runner.invoke(app, ["rollout", "--out", "x.parquet", "--mode", "test"])
    assert res.exit_code == 2 and "--mode must be train or val" in res.output


def test_models_prepare_tiny():
    res = runner.invoke(app, ["models", "prepare", "--base", "tiny-random-llama"])
    assert res.exit_code == 0 and "tiny-random-llama: ready at" in res.output


def test_sigterm_stops_like_ctrl_c_inside_the_context_only():
    import os
    import signal
    import time

    from cli.common import sigterm_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # not reached: the handler raises as soon as the signal arrives
    assert signal.getsignal(signal.SIGTERM) is before


def test_config_show_origin_prints_each_key_its_value_and_its_layer():
    r = runner.invoke(app, ["config", "show", "--origin", "--preset", "cpu-small", "--set", "actor.lr=3e-5"])
    assert r.exit_code == 0, r.output
    lines = {ln.split()[0]: ln for ln in r.output.splitlines()}
    assert lines["actor.lr"].split()[1] == "3.0e-05" and lines["actor.lr"].endswith("# override")
    assert lines["envs.train.tags"].endswith("# preset cpu-small") and "[Bandit]" in lines["envs.train.tags"]
    assert lines["trainer.run_dir"].endswith("# default")
    bad = runner.invoke(app, ["config", "show", "--origin", "--set", "actor.lrr=1"])
    assert bad.exit_code == 2 and "actor.lrr" in bad.output
