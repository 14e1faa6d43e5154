"""The ablation grid end to end at a tiny scale: `dvc repro report` in a fresh git + DVC repo holding the project's
own dvc.yaml, with params.yaml's `experiments` block set to two experiments of one iteration on the tiny model.
Checks the report, the curves and plots, the MLflow sweep parent with its tagged children (and their rebuild from
the reports into an empty tracking database), and that a second `dvc repro` runs nothing."""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_loop import TINY_MODEL

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXPERIMENTS = ["starpo-ppo-bandit", "starpo-s-bandit"]
# the tiny model, 4 groups x 4 Bandit rollouts, 1 iteration (evaluated before and after), the Bandit panel tag only
TINY_GRID = [f"model.base={TINY_MODEL}", "model.dtype=fp32", "rollout.engine=hf", "rollout.response_length=8",
             "envs.train.n_groups=[4]", "envs.train.group_size=4", "actor.ppo_mini_batch_size=4",
             "critic.ppo_mini_batch_size=4", "actor.micro_batch_size=4", "critic.micro_batch_size=4",
             "actor.gradient_checkpointing=false", "critic.gradient_checkpointing=false",
             "trainer.total_training_steps=1", "trainer.test_freq=1", "eval.tags=[Bandit]",
             "rollout.sync_mean_tol=1e-3", "rollout.sync_max_tol=1e-2"]


def dvc(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "CI": "1"}
    r = subprocess.run([str(BIN / "dvc"), *args], cwd=repo, capture_output=True, text=True, env=env, timeout=1500)
    if check:
        assert r.returncode == 0, f"dvc {' '.join(args)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


@pytest.fixture(scope="module")
def grid_repo(tmp_path_factory, prefect_api):
    # the stages' flows (and the module's `ragen` commands) use the session's Prefect server, not one each
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_API_URL", prefect_api)
        yield _grid_repo(tmp_path_factory.mktemp("grid"))


def _grid_repo(tmp):
    """`dvc repro report` of the tiny grid in a fresh git + DVC repo holding the project's dvc.yaml."""
    from tasks.versioning import init_repo

    repo = tmp / "repo"
    init_repo(repo, tmp / "remote")
    for d in ("ragen", "tasks", "flows", "infra"):  # the stages' code dependencies, as in the project
        shutil.copytree(ROOT / d, repo / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / ".dvc" / "plots", repo / ".dvc" / "plots")
    shutil.copy(ROOT / "dvc.yaml", repo / "dvc.yaml")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["experiments"].update({"run": EXPERIMENTS, "seeds": [0], "overrides": TINY_GRID})
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    first = dvc(repo, "repro", "report")
    return repo, first


def test_dvc_repro_runs_the_grid_and_writes_the_report(grid_repo):
    repo, first = grid_repo
    for name in EXPERIMENTS:
        assert f"ablation-train@{name}-0" in first.stdout and f"ablation-eval@{name}-0" in first.stdout
        d = repo / "reports" / "grid" / f"{name}-s0"
        train = json.loads((d / "train.json").read_text())
        assert train["iterations"] == 1 and train["experiment"] == name
        hist = json.loads((d / "history.json").read_text())["iterations"]
        assert len(hist) == 1 and all("echo/warning" in h and "rollout/in_group_std" in h for h in hist)
        ev = json.loads((d / "eval" / "eval.json").read_text())
        assert ev["metrics"]["Bandit/episodes"] == 32 and 0 <= ev["metrics"]["Bandit/success"] <= 1
        m = ev["metrics"]
        assert m["Bandit/success_lo"] <= m["Bandit/success"] <= m["Bandit/success_hi"]
        assert (d / "eval" / "rollouts.parquet").is_file()
        # the run's final validation already scored its last checkpoint on the panel: taken, not sampled again
        assert ev["reused_from"].endswith("iter_00000/eval-panel") and ev["iteration"] == 0
    md = (repo / "reports" / "ablations.md").read_text()
    assert "## StarPO vs StarPO-S (Fig. 9)" in md and "| starpo-s-bandit | " in md and "| starpo-ppo-bandit | " in md
    assert "| starpo-s-bandit > starpo-ppo-bandit | Bandit |" in md and "## Echo Trap diagnostics" in md
    assert f"`model.base={TINY_MODEL}`" in md  # the grid-wide overrides are stated beside the numbers
    assert (repo / "reports" / "ablations" / "fig9.png").stat().st_size > 1000
    rows = list(csv.DictReader((repo / "reports" / "ablations" / "curves.csv").open()))
    assert {r["run"] for r in rows} == {f"{n}-s0" for n in EXPERIMENTS}
    assert sorted(int(r["step"]) for r in rows if r["run"] == "starpo-s-bandit-s0") == [0, 1]


def test_an_evaluation_with_other_settings_is_not_reused(grid_repo, tmp_path):
    from flows.ablations import grid_config
    from ragen.experiments import read_grid
    from ragen.run.evaluation import reuse_run_evaluation

    repo, _ = grid_repo
    run_dir = json.loads((repo / "reports" / "grid" / "starpo-s-bandit-s0" / "train.json").read_text())["run_dir"]
    cwd = os.getcwd()
    os.chdir(repo)  # the panel path is relative to the project
    try:
        _, cfg, _ = grid_config(read_grid("params.yaml"), "starpo-s-bandit", 0)
        assert reuse_run_evaluation(cfg, run_dir, tmp_path / "same") is not None
        other = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"pass_k": 2})})
        assert reuse_run_evaluation(other, run_dir, tmp_path / "pass2") is None
        hot = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"val_temperature": 1.0})})
        assert reuse_run_evaluation(hot, run_dir, tmp_path / "hot") is None
    finally:
        os.chdir(cwd)
    assert not (tmp_path / "pass2").exists()


def test_second_repro_is_a_no_op(grid_repo):
    repo, _ = grid_repo
    again = dvc(repo, "repro", "report")
    assert "Running stage" not in again.stdout, again.stdout
    status = dvc(repo, "status", "report")  # the grid and what it depends on (not the sft or train stages)
    assert "changed" not in status.stdout, status.stdout


def test_mlflow_sweep_parent_and_tagged_children(grid_repo):
    import mlflow

    repo, _ = grid_repo
    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ragen")
    parents = client.search_runs([exp.experiment_id], "tags.ragen_role = 'sweep'")
    assert len(parents) == 1 and parents[0].info.run_name == "ablations-cpu-small"
    assert parents[0].info.status == "FINISHED"
    parent = parents[0].info.run_id
    kids = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert sorted(k.data.tags["experiment_name"] for k in kids) == sorted(EXPERIMENTS)
    by = {k.data.tags["experiment_name"]: k for k in kids}
    assert by["starpo-s-bandit"].data.tags["algorithm"] == "starpo-s"
    assert by["starpo-ppo-bandit"].data.tags["algorithm"] == "starpo-ppo"
    assert all(k.info.status == "FINISHED" and "echo/warning" in k.data.metrics for k in kids)
    assert "panel/Bandit/success" in by["starpo-s-bandit"].data.metrics  # the final evaluation, logged to the run
    arts = [a.path for a in client.list_artifacts(parent, "report")]
    assert "report/ablations.md" in arts


def test_mlflow_restore_rebuilds_the_sweep_from_the_reports(grid_repo, tmp_path, monkeypatch):
    """`ragen grid mlflow-restore` into an empty tracking database: the same parent and children, params, knobs
    and metric histories as the runs logged while training, from reports/grid alone; a second restore adds
    nothing, and a run scored with other settings than params.yaml's is listed, not restored."""
    import mlflow

    from flows.grid_tracking import grid_restore_tracking

    repo, _ = grid_repo
    monkeypatch.chdir(tmp_path)  # the new experiment's artifacts land here, not in the repo
    uri = f"sqlite:///{tmp_path / 'restored.db'}"
    args = (str(repo / "params.yaml"), str(repo / "reports" / "grid"), str(repo / "reports" / "ablations.md"), uri)
    names = {json.loads((repo / "reports" / "grid" / f"{n}-s0" / "train.json").read_text())["run_name"]
             for n in EXPERIMENTS}
    first = grid_restore_tracking(*args)
    assert set(first["restored"]) == names and first["present"] == [] and first["other_settings"] == []
    again = grid_restore_tracking(*args)
    assert again["restored"] == [] and set(again["present"]) == names

    def sweep(client):
        exp = client.get_experiment_by_name("ragen").experiment_id
        parent = client.search_runs([exp], "tags.ragen_role = 'sweep'")
        assert len(parent) == 1
        kids = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent[0].info.run_id}'")
        return parent[0], {k.info.run_name: k for k in kids}

    def points(c, r, key):
        return sorted({(m.step, m.value) for m in c.get_metric_history(r.info.run_id, key)})

    orig, new = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}"), mlflow.MlflowClient(uri)
    (_, logged), (parent, restored) = sweep(orig), sweep(new)
    assert set(restored) == set(logged) == names
    for name, o in logged.items():
        n = restored[name]
        assert n.info.status == "FINISHED" and n.data.tags["ragen_restored_from"].endswith(
            f"{o.data.tags['experiment_name']}-s0")
        same = {k: v for k, v in o.data.params.items() if k != "tracking.mlflow_tracking_uri"}
        assert {k: v for k, v in n.data.params.items() if k in same} == same and len(n.data.params) == len(
            o.data.params)
        for tag in ("experiment_name", "finding", "algorithm", "scale", "seed", "preset"):
            assert n.data.tags[tag] == o.data.tags[tag], tag
        for key in ("panel/Bandit/success", "val/Bandit/success", "init/val/Bandit/success", "rollout/in_group_std",
                    "actor/grad_norm", "echo/warning"):
            assert points(new, n, key) == points(orig, o, key) and points(new, n, key), key
    assert "report/ablations.md" in [a.path for a in new.list_artifacts(parent.info.run_id, "report")]
    # params.yaml changed since the grid ran: those outputs are no longer this grid's runs
    changed = tmp_path / "params.yaml"
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["experiments"]["overrides"] = [*params["experiments"]["overrides"], "actor.lr=3e-6"]
    changed.write_text(yaml.safe_dump(params, sort_keys=False))
    other = grid_restore_tracking(str(changed), *args[1:3], f"sqlite:///{tmp_path / 'other.db'}")
    assert other["restored"] == [] and len(other["other_settings"]) == 2


def test_dvc_plots_render_offline(grid_repo, tmp_path):
    """`ragen grid plots` writes the dvc plots page with vega inlined: no script is loaded from the network."""
    repo, _ = grid_repo
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    r = subprocess.run([str(BIN / "ragen"), "grid", "plots", "--out", str(tmp_path / "plots")], cwd=repo,
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    page = (tmp_path / "plots" / "index.html").read_text()
    assert "<script src=" not in page and "vegaEmbed" in page and "val_success" in page
    assert "starpo-s-bandit-s0" in page  # the data of both runs is in the page
    # and a real headless browser draws it with the network unused (no proxy, no DNS): the charts' pixels are there
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        assert not os.environ.get("CI"), "CI installs chromium (.ci/run) for this check"
        pytest.skip("no chromium here (apt-get install chromium)")
    png = tmp_path / "plots.png"
    shot = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--proxy-server=127.0.0.1:9", "--window-size=1200,900", "--virtual-time-budget=10000",
                           f"--screenshot={png}", (tmp_path / "plots" / "index.html").as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert png.is_file(), shot.stderr[-2000:]
    from PIL import Image

    img = Image.open(png).convert("L")
    ink = sum(img.histogram()[:200]) / (img.width * img.height)  # axes, lines and labels; a blank page has none
    assert ink > 0.005, f"the plots page rendered blank ({ink:.2%} drawn)"


def test_ragen_eval_scores_the_registered_champion(grid_repo):
    """`ragen eval --mlflow-model NAME@champion`: the grid's runs registered their actors; the champion is
    downloaded and scored on the panel with the agent settings given."""
    repo, _ = grid_repo
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    over = [x for o in (*TINY_GRID, "envs.train.tags=[Bandit]", "agent.max_turn=1", "agent.max_actions_per_turn=1")
            for x in ("--set", o)]
    r = subprocess.run([str(BIN / "ragen"), "eval", "--mlflow-model", "ragen-actor@champion", "--panel",
                        "data/panels/cpu-small.json", "--tag", "Bandit", "--out", "reports/eval/champion",
                        "--preset", "cpu-small", *over], cwd=repo, capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ev = json.loads((repo / "reports" / "eval" / "champion" / "eval.json").read_text())
    assert ev["mlflow_model"] == "ragen-actor@champion" and ev["metrics"]["Bandit/episodes"] == 32
    assert "Bandit " in r.stdout and "[" in r.stdout  # the per-tag table with its interval
    bad = subprocess.run([str(BIN / "ragen"), "eval", "--mlflow-model", "ragen-actor@nope", "--panel",
                          "data/panels/cpu-small.json", "--preset", "cpu-small", *over], cwd=repo,
                         capture_output=True, text=True, env=env, timeout=900)
    assert bad.returncode == 2 and "no such registered model version" in bad.stderr
