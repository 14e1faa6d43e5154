"""SFT warm-start: the FrozenLake planner against hand-computed values and the env's own dynamics, solver demos
(replay to success, parse with the project's parser, assistant-only loss mask, no Bandit answer leakage), the
masked loss, warm-start resolution, and SFT training (full and LoRA) on the tiny model."""

import json
import math

import numpy as np
import pytest
import torch

from ragen.agent.chat import Kind
from ragen.agent.parsing import map_actions, parse_response
from ragen.config import load_config
from ragen.envs import get_tag
from ragen.envs.frozen_lake_planner import FrozenLakePlanner, transition_matrices
from ragen.models import TINY_MODEL
from ragen.sft import pipeline
from ragen.sft.demos import demo_agent, make_demos, play_demo


def sft_cfg(*extra, tags="[Bandit,SimpleSokoban,FrozenLake]"):
    return load_config(None, ["cpu-small"], [f"sft.tags={tags}", *extra])


# -- planner ----------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_transitions_follow_the_slip_rule():
    P = transition_matrices(["SF", "HG"])
    # from S (cell 0) pressing Right (3): Right -> cell 1, Up -> stays (off grid), Down -> the hole (cell 2)
    assert P[3][0].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0])
    assert P[3][3].tolist() == [0, 0, 0, 1] and P[1][2].tolist() == [0, 0, 1, 0]  # goal and hole absorb
    assert transition_matrices(["SF", "HG"], is_slippery=False)[3][0].tolist() == [0, 1, 0, 0]


@pytest.mark.unit
def test_planner_values_by_hand():
    # S F / F G, one turn of one action from S: Down or Right reach... nothing in one step (G is diagonal)
    p = FrozenLakePlanner(["SF", "FG"], per_turn=1)
    assert p.success_probability(0, 1, 1) == 0.0
    # from cell 1 (top right) pressing Down: Down -> G, Left -> S, Right -> stays: 1/3
    assert p.success_probability(1, 1, 1) == pytest.approx(1 / 3)
    # two single-action turns from S: best first move reaches cell 1 or 2 with 2/3 (Down: Down, Right; or
    # Right: Right, Down), then 1/3: 2/9
    assert p.success_probability(0, 2, 2) == pytest.approx(2 / 9)
    # without slips the optimal plan is a shortest path, in one turn when it fits
    q = FrozenLakePlanner(["SF", "FG"], per_turn=2, is_slippery=False)
    assert q.success_probability(0, 1, 2) == 1.0 and len(q.plan(0, 1, 2)) == 2


@pytest.mark.unit
def test_planner_probability_matches_the_env_dynamics():
    """The closed-loop turn plans, played in the real env (gymnasium's slips), succeed as often as the planner
    says: the planner's transition model is the env's."""
    from ragen.agent.turns import execute_turn

    spec = get_tag("FrozenLake")
    env = spec.make()
    env.reset(seed=3)
    desc = env.desc
    turns, per_turn, budget = 3, 2, 6
    planner = FrozenLakePlanner(desc, per_turn)
    wins, n = 0, 3000
    for i in range(n):
        env.reset(seed=3, options={"member": i})  # same map, a different slip stream each time
        left, done = budget, False
        for t in range(turns):
            r, c = env.position
            out = execute_turn(env, planner.plan(r * env.size + c, turns - t, left), left)
            left -= len(out.executed)
            if out.done or left == 0:
                done = out.success
                break
        wins += done
    start = "".join(desc).index("S")
    p = planner.success_probability(start, turns, budget)
    assert 0.05 < p < 0.95  # a map where slips matter
    assert abs(wins / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (wins / n, p)


# -- demos ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demos(renderer):
    cfg = sft_cfg("sft.n_train=12", "sft.n_test=2", "sft.max_actions_per_turn=3")
    return cfg, make_demos(cfg, renderer)


@pytest.mark.unit
def test_demos_replay_in_the_env_to_success(demos):
    """Replaying each demo's executed actions from the same seed (same slips) gives the recorded outcome; every
    Sokoban and FrozenLake demo succeeds."""
    cfg, df = demos
    assert set(df["tag"]) == {"Bandit", "SimpleSokoban", "FrozenLake"}
    assert df.groupby(["split", "tag"]).size().to_dict() == {
        **{("train", t): 12 for t in ("Bandit", "SimpleSokoban", "FrozenLake")},
        **{("test", t): 2 for t in ("Bandit", "SimpleSokoban", "FrozenLake")}}
    assert not set(df[df.split == "train"]["seed"]) & set(df[df.split == "test"]["seed"])
    for row in df.itertuples():
        spec = get_tag(row.tag)
        env = spec.make()
        env.reset(seed=int(row.seed), options={"member": None})
        by_name = {v: k for k, v in env.action_lookup.items()}
        success = False
        for names in row.turn_actions:
            for name in names:
                *_, info = env.step(by_name[name])
                success = bool(info.get("success", False))
        assert success == bool(row.success)
        if spec.env_type != "bandit":
            assert row.success, f"{row.tag} seed {row.seed} demo does not succeed"
        assert len(row.turn_actions) <= cfg.sft.max_turn
        assert all(len(a) <= cfg.sft.max_actions_per_turn for a in row.turn_actions)


@pytest.mark.unit
def test_every_demo_parses_with_the_project_parser(demos):
    cfg, df = demos
    agent = demo_agent(cfg)
    for row in df.itertuples():
        assert len(row.responses) == row.num_turns
        env = get_tag(row.tag).make()
        env.reset(seed=int(row.seed))
        for text, executed in zip(row.responses, row.turn_actions, strict=True):
            p = parse_response(text, enable_think=True, max_actions=agent.max_actions_per_turn)
            assert p.matched and p.think and not p.truncated
            assert not map_actions(p.actions, env.action_lookup).format_error
            assert list(p.actions)[:len(executed)] == list(executed)
        assert not any(row.turn_format_error) and row.num_format_errors == 0


@pytest.mark.unit
def test_loss_mask_covers_the_assistant_tokens_only(demos, renderer):
    _, df = demos
    prefix_len = len("<think>")
    for row in df.itertuples():
        mask, kinds = np.asarray(row.loss_mask), np.asarray(row.kinds)
        assert set(kinds[mask].tolist()) == {int(Kind.SAMPLED)}  # sampled-kind ids: the response tokens
        assert not (kinds == Kind.SAMPLED)[~mask].any()
        assert int(Kind.PREFIX) in kinds[~mask].tolist()  # the forced <think> is prompt, not target
        expected = [i for t in row.responses for i in renderer.encode(t[prefix_len:]) + [renderer.end_of_turn_id]]
        assert np.asarray(row.input_ids)[mask].tolist() == expected


@pytest.mark.unit
def test_bandit_demos_choose_arms_uniformly_and_never_by_payout(renderer):
    cfg = sft_cfg("sft.n_train=200", "sft.n_test=0", tags="[Bandit]")
    df = make_demos(cfg, renderer)
    hi = df["success"].mean()  # success = the high-risk arm was chosen
    assert len(df) == 200 and 0.4 < hi < 0.6
    first = np.mean([r[0].split("try ")[1].startswith(a[0][0]) for r, a in zip(df["responses"], df["turn_actions"],
                                                                             strict=True)])
    assert first == 1.0  # the think names the arm the answer gives
    think = " ".join(r[0] for r in df["responses"])
    assert "risk" not in think.lower() and "pays more" not in think.lower()


@pytest.mark.unit
def test_sokoban_instances_beyond_the_budget_are_skipped(renderer):
    cfg = sft_cfg("sft.max_turn=1", "sft.max_actions_per_turn=2", "sft.n_train=3", "sft.n_test=0",
                  tags="[SimpleSokoban]")
    df = make_demos(cfg, renderer)
    assert len(df) == 3 and all(len(a[0]) <= 2 for a in df["turn_actions"]) and df["success"].all()


@pytest.mark.unit
def test_play_demo_without_think_answers_only(renderer):
    cfg = sft_cfg("sft.enable_think=false")
    d = play_demo(get_tag("SimpleSokoban"), demo_agent(cfg), renderer, seed=5)
    assert all(r.startswith("<answer>") and "<think>" not in r for r in d.responses) and d.trajectory.success


# -- warm-start resolution --------------------------------------------------------------------------------------
@pytest.mark.unit
def test_warm_start_resolution(tmp_path):
    off = sft_cfg("model.warm_start=off", "agent.enable_think=true")
    assert not pipeline.uses_warm_start(off) and pipeline.warm_start_path(off) is None
    nothink = sft_cfg("model.warm_start=auto", "agent.enable_think=false")
    assert not pipeline.uses_warm_start(nothink) and not pipeline.needs_build(nothink)
    auto = sft_cfg("model.warm_start=auto", "agent.enable_think=true", f"sft.output={tmp_path / 'ws'}")
    assert pipeline.needs_build(auto)
    with pytest.raises(FileNotFoundError, match="ragen sft"):
        pipeline.warm_start_path(auto)
    ck = tmp_path / "ws"
    (ck / "actor").mkdir(parents=True)
    (ck / "actor" / "config.json").write_text("{}")
    (ck / "checkpoint-complete").write_text("1")
    (ck / "sft.json").write_text(json.dumps({"fingerprint": pipeline.fingerprint(auto)}))
    assert not pipeline.needs_build(auto) and pipeline.warm_start_path(auto) == str(ck / "actor")
    (ck / "sft.json").write_text(json.dumps({"fingerprint": pipeline.fingerprint(auto), "max_turn_tokens": 60}))
    with pytest.raises(ValueError, match=r"raise rollout\.response_length to at least 60"):
        pipeline.warm_start_path(auto)  # cpu-small's 32 tokens per turn would cut every demo-style answer
    (ck / "sft.json").write_text(json.dumps({"fingerprint": pipeline.fingerprint(auto), "max_turn_tokens": 30}))
    stale = sft_cfg("model.warm_start=auto", "agent.enable_think=true", f"sft.output={ck}", "sft.lr=1e-3")
    assert pipeline.needs_build(stale)  # other SFT settings: the checkpoint no longer describes them
    explicit = sft_cfg(f"model.warm_start={ck}")
    assert pipeline.warm_start_path(explicit) == str(ck / "actor")
    with pytest.raises(FileNotFoundError, match=r"model\.warm_start"):
        pipeline.warm_start_path(sft_cfg(f"model.warm_start={tmp_path / 'nothing'}"))


@pytest.mark.unit
def test_one_warm_start_serves_runs_that_change_built_in_tags(renderer):
    """The granularity ablation varies SimpleSokoban's action budget per run: all start from one warm-start, whose
    demos keep the built-in budget; a tag that envs.custom defines (and sft.tags lists) is the demos' own."""
    from ragen.experiments import experiment_settings

    def grid_cfg(name):
        r = experiment_settings(name, "cpu-small")
        return load_config(None, list(r.presets), list(r.overrides))

    g1, g7 = grid_cfg("granularity-1"), grid_cfg("granularity-7")
    budgets = [g.tag_specs()["SimpleSokoban"].max_actions_per_traj for g in (g1, g7)]
    assert budgets == [5, 35]
    assert pipeline.fingerprint(g1) == pipeline.fingerprint(g7) == pipeline.fingerprint(grid_cfg("online-1"))
    budget = get_tag("SimpleSokoban").max_actions_per_traj
    changed = sft_cfg("envs.custom={SimpleSokoban: {max_actions_per_traj: 5}}", "sft.n_train=1", "sft.n_test=0",
                      tags="[SimpleSokoban]")
    assert changed.tag_specs()["SimpleSokoban"].max_actions_per_traj == 5 != budget
    text = renderer.decode(list(make_demos(changed, renderer)["input_ids"][0]))
    assert f"You can make up to {budget} actions" in text
    new_tag = sft_cfg("envs.custom={Sok8: {base: SimpleSokoban, max_actions_per_traj: 7}}", "sft.n_train=1",
                      "sft.n_test=0", tags="[Sok8]")
    assert pipeline.fingerprint(new_tag) != pipeline.fingerprint(sft_cfg("sft.n_train=1", "sft.n_test=0",
                                                                         tags="[SimpleSokoban]"))
    df = make_demos(new_tag, renderer)
    assert df["tag"].tolist() == ["Sok8"]
    assert "You can make up to 7 actions" in renderer.decode(list(df["input_ids"][0]))


# -- training ---------------------------------------------------------------------------------------------------
TINY_SFT = [f"model.base={TINY_MODEL}", "sft.n_train=6", "sft.n_test=2", "sft.mini_batch_size=3", "sft.lr=3e-3",
            "sft.compute_dtype=fp32", "sft.max_actions_per_turn=3"]


@pytest.mark.unit
def test_masked_loss_equals_token_logprobs_over_the_mask(demos):
    from ragen.models import ensure_model
    from ragen.sft.train import masked_nll
    from ragen.train.batch import sequences_from_rollouts
    from ragen.train.networks import load_actor, token_logprobs
    from ragen.train.update import micro_batches

    _, df = demos
    seqs = sequences_from_rollouts(df.head(4))
    model = load_actor(ensure_model(TINY_MODEL))
    (mb,) = micro_batches(seqs, [0, 1, 2, 3], micro_batch_size=4, token_budget=0, pad_id=0)
    with torch.no_grad():
        nll, n = masked_nll(model, mb)
        lp, _ = token_logprobs(model, mb.input_ids, mb.attention_mask)
    assert int(n) == int(mb.loss_mask.sum())
    assert float(nll) == pytest.approx(-float((lp * mb.loss_mask).sum()), rel=1e-5)


@pytest.mark.integration
@pytest.mark.parametrize("lora", [0, 8])
def test_sft_lowers_the_demo_loss_and_saves_a_loadable_model(tmp_path, lora, capsys):
    from safetensors.torch import load_file

    from ragen.models import ensure_model
    from ragen.train.trainer import Trainer

    cfg = load_config(None, ["cpu-small"], [*TINY_SFT, "sft.tags=[Bandit,SimpleSokoban]", "sft.epochs=4",
                                            f"sft.lora_rank={lora}", f"sft.demos={tmp_path / 'demos.parquet'}",
                                            f"sft.output={tmp_path / 'ck'}"])
    demos = pipeline.make_demos_stage(cfg)
    assert pipeline.make_demos_stage(cfg) == demos  # reused: same settings
    capsys.readouterr()
    seen = []  # the progress file a watcher in another process reads (`ragen up`), looked at on every write
    write_json = pipeline.write_json

    def watched(path, data):
        write_json(path, data)
        seen.append(json.loads(path.read_text())["step"])

    pipeline.write_json = watched
    try:
        path, m = pipeline.train_stage(cfg, demos)
    finally:
        pipeline.write_json = write_json
    assert seen == list(range(1, 17)) and not pipeline.progress_file(tmp_path / "ck").exists()  # gone once done
    assert m["sft/steps"] == 4 * 4 and m["sft/train_loss_last"] < m["sft/train_loss_first"]
    progress = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("sft step ")]
    assert [ln.split(":")[0] for ln in progress] == [f"sft step {k}/16" for k in range(1, 17)]  # off a terminal
    assert m["sft/test_loss"] < m["sft/test_loss_before"]
    assert (path / "checkpoint-complete").is_file() and (path / "deepspeed" / "actor").is_dir()
    record = json.loads((path / "sft.json").read_text())
    assert record["fingerprint"] == pipeline.fingerprint(cfg)
    assert len((path / pipeline.HISTORY).read_text().splitlines()) == 16
    base = load_file(str(__import__("pathlib").Path(ensure_model(TINY_MODEL)) / "model.safetensors"))
    tuned = load_file(str(path / "actor" / "model.safetensors"))
    assert set(tuned) == set(base)  # a plain model: LoRA merged, no adapter names
    assert any(not torch.equal(base[k], tuned[k]) for k in base)
    assert (path / "adapter").is_dir() == bool(lora)
    if lora:
        assert m["sft/trainable_params"] < 0.5 * sum(v.numel() for v in base.values())
    # the checkpoint is a model.base for RL: the trainer starts from it
    rl = load_config(None, ["cpu-small"], [f"model.base={TINY_MODEL}", f"model.warm_start={path}",
                                           "actor.gradient_checkpointing=false"])
    t = Trainer(rl, model_path=pipeline.warm_start_path(rl))
    w = dict(t.named_weights())
    k = next(iter(tuned))
    assert torch.equal(w[k], tuned[k])


@pytest.mark.integration
def test_sft_flow_demos_train_evaluate_version_and_log(prefect_api, tmp_path, dvc_repo):
    """The Prefect flow ragen-sft with real vLLM + DeepSpeed + DVC + MLflow on the tiny model."""
    import mlflow

    from flows.sft import sft_flow

    db = tmp_path / "m.db"
    over = [*TINY_SFT, "sft.tags=[Bandit,FrozenLake]", "sft.eval_n=3", "sft.response_length=8",
            "rollout.kv_cache_gib=1", f"sft.demos={dvc_repo / 'data' / 'demos.parquet'}",
            f"sft.output={dvc_repo / 'models' / 'ws'}", f"tracking.mlflow_tracking_uri=sqlite:///{db}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mla'}", "tracking.experiment=sft-test"]
    out = sft_flow(None, ["cpu-small"], over)
    ck = dvc_repo / "models" / "ws"
    for when in ("before", "after"):
        m = json.loads((ck / pipeline.EVAL_FILES[when]).read_text())
        assert m["Bandit/episodes"] == 3 and m["FrozenLake/episodes"] == 3 and 0 <= m["format_valid_mean"] <= 1
    assert not (dvc_repo / "models" / "ws.eval").exists()
    assert sorted(out["dvc"]["added"]) == sorted([str((dvc_repo / "data" / "demos.parquet").resolve()),
                                                  str(ck.resolve())])
    assert (dvc_repo / "models" / "ws.dvc").is_file() and (dvc_repo / "data" / "demos.parquet.dvc").is_file()
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    r = client.get_run(out["mlflow_run_id"])
    assert r.info.status == "FINISHED" and r.data.params["sft.lr"] == "0.003"
    assert "after/format_valid_mean" in r.data.metrics and "before/Bandit/format_valid" in r.data.metrics
    assert len(client.get_metric_history(r.info.run_id, "sft/loss")) == 4
    assert {a.path for a in client.list_artifacts(r.info.run_id, "sft")} >= {"sft/eval_after.json", "sft/sft.json"}


@pytest.mark.integration
def test_rl_with_thinking_starts_from_the_auto_warm_start(tmp_path):
    """model.warm_start=auto with thinking on: the loop makes the SFT checkpoint first, RL starts from its actor
    (weights after a near-zero-lr iteration equal the SFT weights, not the base's), and a second run reuses it."""
    from safetensors.torch import load_file
    from test_loop import TINY

    from ragen.models import ensure_model
    from ragen.run.loop import run_training

    ck = tmp_path / "ws"
    over = [*TINY, *TINY_SFT, "sft.tags=[SimpleSokoban]", "sft.eval_n=2", "sft.response_length=8",
            f"sft.demos={tmp_path / 'demos.parquet'}", f"sft.output={ck}", "model.warm_start=auto",
            "agent.enable_think=true", "rollout.response_length=96", "actor.lr=1e-12", "trainer.val_before_train=false",
            f"trainer.run_dir={tmp_path / 'runs'}", "trainer.total_training_steps=1"]
    cfg = load_config(None, ["cpu-small"], over)
    assert pipeline.needs_build(cfg)
    res = run_training(cfg, "ws-run")
    assert res.iterations == [0] and pipeline.checkpoint_ready(cfg)
    assert not (ck / pipeline.EVAL_FILES["after"]).exists()  # the RL loop's warm-start skips the format eval
    assert json.loads((ck / "sft.json").read_text())["max_turn_tokens"] <= 96
    sft_w = load_file(str(ck / "actor" / "model.safetensors"))
    rl_w = load_file(str(res.run.state(0) / "actor" / "model.safetensors"))
    base = load_file(str(__import__("pathlib").Path(ensure_model(TINY_MODEL)) / "model.safetensors"))
    k = "model.layers.0.mlp.up_proj.weight"
    assert torch.allclose(rl_w[k], sft_w[k], atol=1e-6) and not torch.allclose(rl_w[k], base[k], atol=1e-4)
    stamp = (ck / "checkpoint-complete").stat().st_mtime
    run_training(cfg, "ws-run-2")
    assert (ck / "checkpoint-complete").stat().st_mtime == stamp  # reused, not made again


@pytest.mark.unit
def test_sft_settings_are_not_part_of_a_run_that_does_not_warm_start(tmp_path):
    """A run from before the SFT settings existed still resumes, and a run without a warm-start keeps its name
    whatever the sft section says; with a warm-start the SFT settings are part of the run."""
    import yaml

    from ragen.config import config_to_dict
    from ragen.run.identity import config_name
    from ragen.run.rundir import ResumeError, RunDir

    cfg = sft_cfg()  # cpu-small: warm_start auto, no thinking
    old = config_to_dict(cfg)
    old["model"].pop("warm_start")
    old.pop("sft")
    run = RunDir.at(tmp_path, "old")
    run.root.mkdir(parents=True)
    (run.root / "config.yaml").write_text(yaml.safe_dump(old))
    run.bind_config(cfg)  # no complaint about keys the old run never had
    assert config_name(cfg) == config_name(sft_cfg("sft.lr=1e-3", "model.warm_start=off"))
    think = sft_cfg("agent.enable_think=true", "model.warm_start=auto")
    assert config_name(think) != config_name(sft_cfg("agent.enable_think=true", "model.warm_start=auto",
                                                     "sft.lr=1e-3"))
    with pytest.raises(ResumeError, match=r"agent\.enable_think"):
        run.bind_config(think)
