"""`ragen bench learn`: a smoke run of the command on the tiny model (real vLLM + DeepSpeed, the plain loop) checks
the JSON's shape and its arithmetic, the curve beside it and the refusals. Whether a model learns is the
benchmark's to measure (its numbers are in docs/benchmarks.md), not this test's: the tiny random model does not."""

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from ragen.models import TINY_MODEL

ROOT = Path(__file__).resolve().parents[1]
RAGEN = str(Path(sys.executable).with_name("ragen"))
TINY = [f"model.base={TINY_MODEL}", "model.dtype=fp32", "rollout.engine=vllm", "rollout.kv_cache_gib=1",
        "rollout.response_length=8", "actor.gradient_checkpointing=false", "critic.gradient_checkpointing=false",
        "rollout.sync_mean_tol=1e-3", "rollout.sync_max_tol=1e-2",
        "model.warm_start=off"]  # params.yaml starts from the SFT warm-start; the tiny model has none


def bench(out: Path, *extra: str) -> subprocess.CompletedProcess:
    sets = [a for o in TINY for a in ("--set", o)]
    return subprocess.run([RAGEN, "bench", "learn", "--quick", "--json", "--out", str(out), *sets, *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=800)


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_quick_bench_prints_the_before_after_json_and_writes_the_curve(tmp_path, monkeypatch):
    out = tmp_path / "learn"
    r = bench(out)
    assert r.returncode == 0, r.stderr[-4000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout  # stdout is the JSON line alone; progress goes to stderr
    res = json.loads(lines[0])
    assert "iteration 2/2" in r.stderr
    assert json.loads((out / "learn.json").read_text()) == res
    assert set(res) >= {"tags", "wall_s", "iterations", "s_per_iteration", "update_share", "config"}
    assert list(res["tags"]) == ["Bandit"]  # params.yaml's validation tag, as the main command
    t = res["tags"]["Bandit"]
    assert t["n"] == 16 and t["n_before"] == 16  # --quick: a 16-seed panel
    for k in ("before", "after"):
        lo, hi = t[f"{k}_ci"]
        assert 0 <= lo <= t[k] <= hi <= 1 and (t[k] * 16).is_integer()
        assert 0 <= t[f"format_errors_{k}"] <= 1
    assert t["diff"] == pytest.approx(t["after"] - t["before"])
    assert -1 <= t["diff_ci"][0] <= t["diff"] <= t["diff_ci"][1] <= 1
    # paired by seed: one sample per seed, so the mean paired difference is the difference of the rates
    assert t["paired_n"] == 16 and t["samples_per_seed"] == 1
    assert t["paired_diff"] == pytest.approx(t["diff"])
    assert t["paired_diff_ci"][0] <= t["paired_diff"] <= t["paired_diff_ci"][1]
    assert t["gained"] - t["lost"] == round(16 * t["diff"]) and 0 < t["mcnemar_p"] <= 1
    assert 0 < t["power_10pp"] <= 1
    assert res["iterations"] == 2 and res["wall_s"] > 0 and res["s_per_iteration"] > 0
    assert 0 < res["update_share"] < 1
    c = res["config"]
    assert c["model"] == TINY_MODEL and c["engine"] == "vllm" and c["train_tags"] == ["Bandit"]
    assert c["n_groups"] == [4] and c["group_size"] == 4 and c["quick"] is True
    assert not (Path(res["run_dir"]) / "checkpoints").exists()  # deleted unless --keep-checkpoints

    rows = list(csv.DictReader((out / "curve.csv").open()))
    panel = [r for r in rows if r["split"] == "panel"]
    train = [r for r in rows if r["split"] == "train"]
    assert [int(r["updates"]) for r in panel] == [0, 1, 2]  # before, and after each iteration (test_freq 1)
    assert [int(r["updates"]) for r in train] == [0, 1] and all(int(r["n"]) == 16 for r in train)
    assert float(panel[0]["success"]) == t["before"] and float(panel[-1]["success"]) == t["after"]
    assert all(not math.isnan(float(r["score"])) for r in rows)
    assert (out / "curve.png").stat().st_size > 5000  # the plot of those rows
    training = list(csv.DictReader((out / "training.csv").open()))
    assert [int(r["iteration"]) for r in training] == [0, 1]
    assert all(float(r["seconds"]) > 0 and not math.isnan(float(r["score"])) for r in training)
    assert res["training"] == str(out / "training.csv") and res["plot"] == str(out / "curve.png")

    (out / "curve.png").unlink()
    (out / "training.csv").unlink()
    redrawn = subprocess.run([RAGEN, "bench", "learn", "--redraw", str(out), "--json"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert redrawn.returncode == 0, redrawn.stderr[-2000:]
    assert (out / "curve.png").stat().st_size > 5000
    assert list(csv.DictReader((out / "training.csv").open())) == training
    assert json.loads(redrawn.stdout)["tags"] == res["tags"]  # the numbers stay; only the files are redrawn

    # the measurement's MLflow record: params, per-iteration metrics and the before/after result
    import mlflow

    from tasks.learning import EXPERIMENT, export_runs, log_learning

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)  # the experiment's artifact folder (tracking.mlflow_artifact_location) goes here
    first = log_learning.fn(str(out), uri)
    assert first["logged"] and not log_learning.fn(str(out), uri)["logged"]  # a second call adds nothing
    client = mlflow.MlflowClient(uri)
    run = client.get_run(first["run_id"])
    assert run.data.metrics["learn/Bandit/after"] == t["after"] and run.data.params["envs.train.group_size"] == "4"
    steps = [m.step for m in client.get_metric_history(first["run_id"], "timing_s/iteration")]
    assert steps == [0, 1]
    assert {a.path for a in client.list_artifacts(first["run_id"])} >= {"learn.json", "curve.png", "training.csv"}
    table = list(csv.DictReader(export_runs(uri, tmp_path / "learning.csv").open()))
    assert [r["tags.mlflow.runName"] for r in table] == ["learn"] and EXPERIMENT == "ragen-learning"
    assert float(table[0]["metrics.learn/Bandit/diff"]) == pytest.approx(t["diff"])

    again = bench(out)  # every measurement trains from a fresh run directory
    assert again.returncode == 2 and "holds a finished learning measurement" in again.stderr


@pytest.mark.unit
def test_bad_settings_fail_before_any_model_loads(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    def invoke(*args: str):
        return CliRunner().invoke(app, ["bench", "learn", "--quick", "--out", str(tmp_path / "x"), *args])

    r = invoke("--set", "actor.lr=fast")
    assert r.exit_code == 2 and "actor.lr" in r.output
    r = invoke("--tag", "Bandt")
    assert r.exit_code == 2 and "Bandt" in r.output and "known:" in r.output
    r = invoke("--experiment", "starpo-s-bandt")
    assert r.exit_code == 2 and "did you mean 'starpo-s-bandit'" in r.output
    assert not (tmp_path / "x" / "learn.json").exists()


@pytest.mark.unit
def test_an_unfinished_measurement_is_continued_only_with_resume_and_its_own_settings(tmp_path):
    """A measurement stopped after iteration 0: a new start in its --out is refused and names --resume; --resume
    takes the settings saved at its start (spec.json), and refuses settings given beside it."""
    from typer.testing import CliRunner

    from cli.main import app
    from ragen.run.learn_bench import SPEC_JSON, LearnSpec, bench_learn, saved_spec

    out = tmp_path / "m"
    spec = LearnSpec(presets=("cpu-small",), overrides=("actor.lr=1e-6",), iterations=3, out=str(out), quick=True)
    (out / "run" / "iter_00000").mkdir(parents=True)
    (out / "run" / "iter_00000" / "COMPLETE").write_text("")
    with pytest.raises(FileExistsError, match=r"1 iterations done.*--resume"):
        bench_learn(spec)
    r = CliRunner().invoke(app, ["bench", "learn", "--resume", "--out", str(out)])
    assert r.exit_code == 2 and "no measurement to resume" in r.output
    json_spec = {"params": None, "presets": ["cpu-small"], "overrides": ["actor.lr=1e-6"], "iterations": 3,
                 "panel": None, "panel_size": 128, "tags": None, "out": str(out), "quick": True,
                 "keep_checkpoints": False, "experiment": None}
    (out / SPEC_JSON).write_text(json.dumps(json_spec))
    assert saved_spec(out) == spec
    r = CliRunner().invoke(app, ["bench", "learn", "--resume", "--out", str(out), "--set", "actor.lr=1"])
    assert r.exit_code == 2 and "without --set" in r.output
    r = CliRunner().invoke(app, ["bench", "learn", "--resume"])
    assert r.exit_code == 2 and "give --out alone" in r.output


@pytest.mark.unit
def test_redraw_needs_a_finished_measurement(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    r = CliRunner().invoke(app, ["bench", "learn", "--redraw", str(tmp_path)])
    assert r.exit_code == 2 and "learn.json" in r.output


@pytest.mark.unit
def test_plot_draws_training_signals_with_gaps(tmp_path):
    from ragen.report.learning_curve import plot_curve
    from ragen.run.learn_bench import TRAINING_FIELDS

    nan = float("nan")
    rows = [{"updates": u, "split": s, "tag": "FrozenLake", "n": 16 if s == "train" else 128, "success": 0.2,
             "success_lo": 0.1, "success_hi": 0.3, "score": 0.2, "format_error_rate": 0.0}
            for u in range(3) for s in ("train", "panel")]
    training = [dict.fromkeys(TRAINING_FIELDS, 0.1) | {"iteration": k} for k in range(3)]
    training[0] |= {"entropy": nan, "explained_variance": nan}  # a value-only warm-up iteration
    path = plot_curve(rows, tmp_path / "c.png", training)
    assert path.stat().st_size > 10000
