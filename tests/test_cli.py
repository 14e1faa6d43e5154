import json

from typer.testing import CliRunner

from ragen.cli import app

runner = CliRunner()


def test_envs_show_prints_first_turn_prompt():
    res = runner.invoke(app, ["envs", "show", "--tag", "SimpleSokoban", "--seed", "123"])
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
    assert out.is_file() and "wrote 32 instances" in res.output


def test_config_error_exit_code():
    res = runner.invoke(app, ["config", "show", "--set", "agent.max_turn=zero"])
    assert res.exit_code == 2 and "agent.max_turn = 'zero'" in res.output
