"""The collapse guard (ragen/run/guard.py): its decisions by hand, rollbacks on a run directory (nothing deleted,
the run resumes from the healthy checkpoint), the remedies, giving up, and a real training loop that trips it."""

import json

import pytest
from test_loop import TINY

from ragen.config import ConfigError, load_config
from ragen.run import guard
from ragen.run.identity import config_name
from ragen.run.rundir import MARKER, RunDir
from ragen.train.checkpoint import COMPLETE as STATE_MARKER

# a signal that is always on, checked after every iteration, each iteration checkpointed and no evaluation: the
# guard trips at iteration 1, rolls back to the base model once, trips again and gives up
ALWAYS_TRIPS = ["trainer.checkpoint_every=1", "trainer.test_freq=100", "diagnostics.window=1",
                "diagnostics.std_collapse=100", "guard.enabled=true", "guard.signals=[std_collapse]",
                "guard.patience=1", "guard.max_rollbacks=1"]


def cfg_with(*extra):
    return load_config(None, ["cpu-small"], ["guard.enabled=true", *extra])


@pytest.mark.unit
def test_signals_and_streak_by_hand():
    on = {"echo/std_collapse": 1.0, "echo/grad_spike": 0.0, "echo/entropy_rise": 1.0}
    assert guard.signals_on(on, ["std_collapse", "grad_spike"]) == ["std_collapse"]
    assert guard.signals_on(on, ["grad_spike"]) == []
    quiet, spike = {"echo/grad_spike": 0.0}, {"echo/grad_spike": 1.0}
    assert guard.streak([spike, quiet, spike, spike], ["grad_spike"]) == 2
    assert guard.streak([spike, quiet], ["grad_spike"]) == 0
    assert guard.streak([], ["grad_spike"]) == 0


@pytest.mark.unit
def test_an_iteration_of_only_non_finite_steps_counts_whatever_signals_are_chosen():
    storm, some, none = {"actor/skipped": 1.0}, {"actor/skipped": 0.5}, {"actor/skipped": 0.0}
    assert guard.signals_on(storm, ["grad_spike"]) == ["nonfinite_steps"]
    assert guard.signals_on({**storm, "echo/grad_spike": 1.0}, ["grad_spike"]) == ["grad_spike", "nonfinite_steps"]
    assert guard.signals_on(some, ["grad_spike"]) == [] and guard.signals_on(none, ["std_collapse"]) == []
    assert guard.streak([none, storm, storm], ["std_collapse"]) == 2
    assert guard.streak([storm, some], ["std_collapse"]) == 0


@pytest.mark.unit
def test_entropy_rise_is_the_blow_up_direction_only():
    from ragen.algos.echo_trap import echo_trap

    def hist(entropies):
        return [{"actor/entropy_loss": e, "rollout/in_group_std": 1.0} for e in entropies]

    up = echo_trap(hist([1.0, 1.0, 2.0, 2.0]), window=2, entropy_change=0.5)
    down = echo_trap(hist([2.0, 2.0, 0.5, 0.5]), window=2, entropy_change=0.5)
    assert up["echo/entropy_rise"] == 1.0 and up["echo/entropy_shift"] == 1.0
    assert down["echo/entropy_rise"] == 0.0 and down["echo/entropy_shift"] == 1.0  # sharpening is not a blow-up


@pytest.mark.unit
def test_guard_config_is_checked():
    with pytest.raises(ConfigError, match="choose from std_collapse"):
        cfg_with("guard.signals=[std_colapse]")
    with pytest.raises(ConfigError, match="lr_scale"):
        cfg_with("guard.lr_scale=2")


@pytest.mark.unit
def test_an_idle_guard_does_not_rename_runs():
    base = load_config(None, ["cpu-small"], ["guard.enabled=false"])
    assert config_name(base) == config_name(load_config(None, ["cpu-small"], ["guard.enabled=false",
                                                                                "guard.patience=5"]))
    assert config_name(base) != config_name(cfg_with())


def fake_run(tmp_path, done, checkpoints):
    run = RunDir(tmp_path / "run")
    for k in done:
        it = run.iteration(k)
        it.mkdir(parents=True)
        (it / "metrics.json").write_text(json.dumps({"echo/std_collapse": 0.0}))
        (it / MARKER).write_text("{}")
    for k in checkpoints:
        st = run.state(k)
        (st / "actor").mkdir(parents=True)
        (st / STATE_MARKER).write_text("1")
    return run


@pytest.mark.unit
def test_roll_back_archives_and_resumes_from_the_healthy_checkpoint(tmp_path):
    cfg = cfg_with("guard.max_rollbacks=2", "guard.lr_scale=0.5", "guard.overrides=[algorithm.filter_ratio=0.5]")
    run = fake_run(tmp_path, range(6), [1, 3, 5])
    run.pointer(run.iteration(5)).write_text("outs: []\n")  # a DVC pointer moves with what it describes
    state = guard.GuardState()
    ev = guard.roll_back(run, cfg, state, at=5, first_bad=4, signals=["std_collapse"])
    # signals on from iteration 4: its rollouts came from checkpoint 3, so the newest healthy one is 1
    assert (ev.to, ev.lr_factor) == (1, 0.5)
    assert run.completed() == [0, 1] and run.next_iteration() == 2 and run.resume_state() == run.state(1)
    arch = run.root / "guard" / "rollback-1"
    assert (arch / "iter_00004" / "metrics.json").is_file() and (arch / "checkpoint_00005" / "actor").is_dir()
    assert (arch / "iter_00005.dvc").is_file() and not run.pointer(run.iteration(5)).exists()
    assert not (arch / "iter_00005" / MARKER).exists()  # an archived iteration never counts as complete
    eff = guard.effective_config(cfg, guard.GuardState.read(run))
    assert eff.actor.lr == pytest.approx(cfg.actor.lr * 0.5) and eff.algorithm.filter_ratio == 0.5
    # the next trip may not go back past the last rollback point; with no checkpoint after it, it restarts there
    (run.iteration(2)).mkdir()
    (run.iteration(2) / MARKER).write_text("{}")
    ev2 = guard.roll_back(run, cfg, guard.GuardState.read(run), at=2, first_bad=2, signals=["grad_spike"])
    assert ev2.to == 1 and ev2.lr_factor == 0.25
    assert guard.effective_config(cfg, guard.GuardState.read(run)).critic.lr == pytest.approx(cfg.critic.lr / 4)
    with pytest.raises(guard.GuardGaveUp, match=r"guard\.max_rollbacks=2"):
        guard.roll_back(run, cfg, guard.GuardState.read(run), at=2, first_bad=2, signals=["grad_spike"])


@pytest.mark.unit
def test_a_crash_inside_a_rollback_is_finished_on_the_next_start(tmp_path, monkeypatch):
    """The rollback is recorded before anything moves and archives newest first: killed after moving one
    iteration, the run still has a prefix of complete iterations, and the next start finishes the rollback."""
    from ragen.run.loop import open_run

    cfg = cfg_with(f"trainer.run_dir={tmp_path}", "trainer.total_training_steps=8")
    run = fake_run(tmp_path, range(5), [0, 1, 2, 3, 4])
    run.bind_config(cfg)
    real, moved = guard._archive, []

    def dies_after_one(run_, k, dest):
        if moved:
            raise KeyboardInterrupt  # the process is killed here
        real(run_, k, dest)
        moved.append(k)

    monkeypatch.setattr(guard, "_archive", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        guard.roll_back(run, cfg, guard.GuardState(), at=4, first_bad=3, signals=["std_collapse"])
    assert moved == [4] and run.completed() == [0, 1, 2, 3]  # no hole: a restart could still read it
    assert guard.GuardState.read(run).rollbacks[0].pending
    monkeypatch.setattr(guard, "_archive", real)
    _, rt, start = open_run(cfg, "run")
    assert start == 2 and rt.resume == run.state(1) and run.completed() == [0, 1]
    (event,) = guard.GuardState.read(run).rollbacks
    assert not event.pending and (event.at, event.to) == (4, 1)
    assert sorted(p.name for p in (run.root / event.archived).iterdir()) == [
        "checkpoint_00002", "checkpoint_00003", "checkpoint_00004", "iter_00002", "iter_00003", "iter_00004"]


@pytest.mark.unit
def test_without_a_checkpoint_the_run_restarts_from_the_base_model(tmp_path):
    run = fake_run(tmp_path, range(3), [])
    ev = guard.roll_back(run, cfg_with(), guard.GuardState(), at=2, first_bad=1, signals=["std_collapse"])
    assert ev.to == -1 and run.completed() == [] and run.resume_state() is None


@pytest.mark.unit
def test_a_damaged_guard_file_names_the_fix(tmp_path):
    run = fake_run(tmp_path, [0], [])
    (run.root / guard.GUARD_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="delete it to continue"):
        guard.GuardState.read(run)


@pytest.mark.integration
def test_the_loop_rolls_back_then_gives_up(tmp_path):
    """A tiny run whose thresholds make every iteration a 'collapse' (std ratio < 100 from iteration 1): the guard
    rolls back twice (learning rates x0.5, x0.25), then stops with GuardGaveUp; nothing completed is lost."""
    from ragen.run.loop import run_training

    cfg = load_config(None, ["cpu-small"], [
        *TINY, f"trainer.run_dir={tmp_path}", "trainer.total_training_steps=3", "trainer.checkpoint_every=1",
        "trainer.val_before_train=false", "trainer.test_freq=100", "diagnostics.window=1",
        "diagnostics.std_collapse=100", "guard.enabled=true", "guard.signals=[std_collapse]", "guard.patience=1",
        "guard.max_rollbacks=2"])
    with pytest.raises(guard.GuardGaveUp, match="after 2 rollback"):
        run_training(cfg, "g")
    run = RunDir(tmp_path / "g")
    state = guard.GuardState.read(run)
    # iteration 1's signals indict checkpoint 0 (its rollouts' policy): both rollbacks go to the base model
    assert [(r.at, r.to, r.lr_factor) for r in state.rollbacks] == [(1, -1, 0.5), (1, -1, 0.25)]
    assert (run.root / "guard" / "rollback-1" / "iter_00001" / "metrics.json").is_file()
    assert (run.root / "guard" / "rollback-2" / "checkpoint_00001").is_dir()
    assert run.completed() == [0, 1] and (run.state(0) / STATE_MARKER).is_file()  # nothing completed is lost
    # the rolled-back iteration trained with the remedied learning rate: it is in its config record
    assert guard.effective_config(cfg, state).actor.lr == pytest.approx(cfg.actor.lr * 0.25)


@pytest.mark.integration
def test_the_flow_logs_rollbacks_to_mlflow(prefect_api, tmp_path):
    """The Prefect flow path: the rollback reaches MLflow (metric guard/rollbacks, a tag per event) and a run
    that recovers (patience 2 over a 2-iteration horizon never trips twice) finishes."""
    import mlflow

    from flows.train_loop import train_loop as flow

    db = tmp_path / "mlflow.db"
    over = [*TINY, *ALWAYS_TRIPS, f"trainer.run_dir={tmp_path}", "trainer.total_training_steps=3",
            "trainer.val_before_train=false", "tracking.dvc=false",
            f"tracking.mlflow_tracking_uri=sqlite:///{db}", f"tracking.mlflow_artifact_location={tmp_path / 'mla'}"]
    with pytest.raises(guard.GuardGaveUp):
        flow(run_name="gf", params=None, preset=["cpu-small"], overrides=over)
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    (r,) = client.search_runs([client.get_experiment_by_name("ragen").experiment_id])
    assert r.info.status == "FAILED"  # gave up: the run says so
    event = json.loads(r.data.tags["guard/rollback_1"])
    assert event["at"] == 1 and event["to"] == -1 and event["signals"] == ["std_collapse"]
    assert [m.value for m in client.get_metric_history(r.info.run_id, "guard/rollbacks")] == [1.0]


@pytest.mark.unit
def test_schema_additions_keep_existing_run_names():
    """Runs made before a setting existed keep their names when it sits at the default that reproduces them
    (LATER_KEYS, the idle guard): here the committed cpu-small grid run of StarPO-S on Bandit (reports/grid/) and
    a Sokoban run made after actor.compute_dtype existed. A new schema key must keep these pins. (They changed on
    purpose once, when the update's defaults became bf16 autocast and length-bucketed 2048-token micro-batches
    without recomputation, issue 25: runs made that way compute differently, so they are new runs.)"""
    from flows.ablations import grid_config
    from ragen.experiments import Grid

    g = Grid(scale="cpu-small")
    assert grid_config(g, "starpo-s-bandit", 0)[2] == "starpo-s-bandit-s0-e56235"
    assert grid_config(g, "granularity-1", 0)[2] == "granularity-1-s0-015099"
