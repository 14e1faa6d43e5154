"""Evaluation panels and metrics against hand-computed values; Echo Trap warnings; report verdicts; every named
experiment resolves to a valid config at each of its scales."""

import json
import math

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragen.algos.echo_trap import echo_trap, first_warning
from ragen.config import load_config
from ragen.eval.metrics import panel_metrics
from ragen.eval.panels import make_panel, read_panel, write_panel
from ragen.eval.stats import mean_interval, pass_at_k, rate_difference, wilson
from ragen.experiments import EXPERIMENTS, Grid, experiment_settings, grid_yaml, read_grid
from ragen.report.ablations import training_effect, write_report
from ragen.report.verdicts import GridResult, claim_verdict, finding_verdict, pooled, training_change

pytestmark = pytest.mark.unit


def test_wilson_matches_hand_values():
    # 8 of 10, z = 1.96: centre (0.8 + 0.19208) / 1.38416 = 0.71674, half 1.96 * sqrt(0.025604) / 1.38416 = 0.22658
    lo, hi = wilson(8, 10, z=1.96)
    assert lo == pytest.approx(0.49016, abs=1e-4) and hi == pytest.approx(0.94332, abs=1e-4)
    lo, hi = wilson(0, 10, z=1.96)  # never below 0, and not degenerate at 0 successes
    assert lo == 0.0 and hi == pytest.approx(0.27753, abs=1e-4)
    assert all(math.isnan(x) for x in wilson(0, 0))
    with pytest.raises(ValueError, match="successes"):
        wilson(11, 10)


@given(st.integers(0, 200), st.integers(1, 200))
def test_wilson_interval_contains_the_rate(k, n):
    k = min(k, n)
    lo, hi = wilson(k, n)
    assert 0 <= lo <= k / n <= hi <= 1


def test_mean_interval_and_pass_at_k():
    m, lo, hi = mean_interval([1.0, 2.0, 3.0, 4.0], z=2.0)  # s = 1.29099, half = 2 * s / 2
    assert (m, lo, hi) == pytest.approx((2.5, 2.5 - 1.29099, 2.5 + 1.29099), abs=1e-4)
    assert mean_interval([5.0]) == (5.0, 5.0, 5.0)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25) and pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 3, 2) == 1.0 and pass_at_k(4, 0, 4) == 0.0


@pytest.mark.parametrize(("a", "n", "b", "m", "lo", "hi"), [  # Newcombe (1998), Table II, method 10
    (56, 70, 48, 80, 0.0524, 0.3339), (9, 10, 3, 10, 0.1705, 0.8090), (6, 7, 2, 7, 0.0582, 0.8062),
    (5, 56, 0, 29, -0.0381, 0.1926), (0, 10, 0, 20, -0.1611, 0.2775), (0, 10, 0, 10, -0.2775, 0.2775)])
def test_rate_difference_matches_newcombes_table(a, n, b, m, lo, hi):
    d, low, high = rate_difference(a, n, b, m)
    assert d == pytest.approx(a / n - b / m) and (low, high) == pytest.approx((lo, hi), abs=1e-4)


def test_rate_difference_is_not_fooled_by_small_counts():
    assert rate_difference(4, 32, 0, 32)[1] < 0 < rate_difference(6, 32, 0, 32)[1]  # Fisher: p = 0.11 vs 0.024
    assert all(math.isnan(x) for x in rate_difference(1, 0, 1, 4))


def _rollouts(rows):
    return pd.DataFrame([{"tag": t, "group": g, "success": s, "score": r, "response_length": n,
                          "turn_format_error": e} for t, g, s, r, n, e in rows])


def test_panel_metrics_per_tag_by_hand():
    df = _rollouts([("A", 0, True, 1.0, 10, [False]), ("A", 0, False, 0.0, 20, [True]),
                    ("A", 1, False, 0.0, 30, [False]), ("A", 1, False, -0.1, 40, [True]),
                    ("B", 2, True, 1.0, 5, [False, False]), ("B", 2, True, 1.0, 7, [False, True])])
    m = panel_metrics(df)
    assert m["A/success"] == 0.25 and (m["A/success_lo"], m["A/success_hi"]) == pytest.approx(wilson(1, 4))
    assert m["A/pass@2"] == pytest.approx(0.5)  # seed 0: n - c = 1 < k = 2, so 1; seed 1: 0
    assert (m["A/pass@2_lo"], m["A/pass@2_hi"]) == pytest.approx(wilson(1, 2))
    assert m["A/reward"] == pytest.approx(0.225) and m["A/response_length"] == 25.0
    assert m["A/format_error_rate"] == 0.5 and m["B/format_error_rate"] == 0.25
    assert m["A/episodes"] == 4 and m["A/seeds"] == 2 and m["B/success"] == 1.0
    assert m["all/success"] == pytest.approx((0.25 + 1.0) / 2)


def test_panel_files_round_trip_and_bad_files_name_the_fix(tmp_path):
    p = make_panel("t", ["Bandit", "FrozenLake"], 3)
    assert p.seeds == {"Bandit": (123, 124, 125), "FrozenLake": (126, 127, 128)}  # the original's layout
    path = write_panel(p, tmp_path / "p.json")
    assert read_panel(path) == p and read_panel(path).select(["FrozenLake"]).pairs() == [("FrozenLake", s)
                                                                                        for s in (126, 127, 128)]
    with pytest.raises(KeyError, match="no seeds for"):
        p.select(["SimpleSokoban"])
    with pytest.raises(FileNotFoundError, match="ragen eval panel"):
        read_panel(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    for text, msg in (("{", "not valid JSON"), ('{"seeds": {"Bandit": [1, 1]}}', "repeat"),
                      ('{"seeds": {"Bandit": [-1]}}', "integers >= 0"), ('{"seeds": {}}', "expected")):
        bad.write_text(text)
        with pytest.raises(ValueError, match=msg):
            read_panel(bad)
    bad.write_text('{"seeds": {"Bandits": [1]}}')
    with pytest.raises(ValueError, match="unknown tag 'Bandits'"):
        read_panel(bad, known_tags=["Bandit"])


def test_echo_trap_flags_by_hand():
    healthy = [{"rollout/in_group_std": 0.5, "actor/entropy_loss": 2.0, "actor/grad_norm": 1.0}] * 6
    d = echo_trap(healthy)
    assert d["echo/std_ratio"] == 1.0 and d["echo/entropy_change"] == 0.0 and d["echo/grad_norm_ratio"] == 1.0
    assert d["echo/warning"] == 0.0
    collapsing = healthy[:3] + [{"rollout/in_group_std": 0.1, "actor/entropy_loss": 2.0, "actor/grad_norm": 1.0}] * 3
    d = echo_trap(collapsing)
    assert d["echo/std_ratio"] == pytest.approx(0.2) and d["echo/std_collapse"] == 1.0 and d["echo/warning"] == 1.0
    spike = healthy[:4] + [{**healthy[0], "actor/grad_norm": 50.0}]
    assert echo_trap(spike)["echo/grad_spike"] == 1.0 and "echo/std_ratio" not in echo_trap(spike)
    assert first_warning(collapsing) == 5 and first_warning(healthy) is None
    # the std falls because every member now succeeds (the mean score rose 0.3 -> 0.9): convergence, no warning;
    # the same fall with a flat score is the Echo Trap
    converged = [{**h, "rollout/in_group_mean": 0.3} for h in healthy[:3]] + \
        [{**h, "rollout/in_group_mean": 0.9} for h in collapsing[3:]]
    d = echo_trap(converged)
    assert d["echo/reward_change"] == pytest.approx(0.6) and d["echo/std_collapse"] == 0.0 and d["echo/warning"] == 0.0
    flat = [{**h, "rollout/in_group_mean": 0.3} for h in collapsing]
    assert echo_trap(flat)["echo/std_collapse"] == 1.0 and echo_trap(flat)["echo/reward_change"] == 0.0


def test_claim_and_finding_verdicts():
    assert claim_verdict((60, 100), (30, 100))[0] == "reproduced"
    assert claim_verdict((30, 100), (60, 100))[0] == "not reproduced"
    assert claim_verdict((31, 100), (30, 100))[0] == "inconclusive"
    assert claim_verdict(None, (30, 100))[0] == "not run"
    assert finding_verdict(["reproduced", "reproduced"]) == "reproduced"
    assert finding_verdict(["reproduced", "inconclusive"]) == "inconclusive at this scale"
    assert finding_verdict(["reproduced", "not reproduced"]) == "mixed"
    assert finding_verdict(["not run"]) == "not run"


def test_report_puts_ours_beside_the_paper(tmp_path):
    ev = {"Bandit/success": 0.75, "Bandit/episodes": 32.0}
    hist = [{"rollout/in_group_std": 0.4, "actor/grad_norm": 1.0, "val/Bandit/success": 0.5}] * 3
    res = [GridResult("starpo-s-bandit", 0, ev, hist, {"val/Bandit/success": 0.0625}),
           GridResult("starpo-ppo-bandit", 0, {"Bandit/success": 0.25, "Bandit/episodes": 32.0}, hist)]
    assert pooled(res, "starpo-s-bandit", "Bandit") == (24, 32)
    md = write_report(res, "cpu-small", tmp_path / "ablations.md").read_text()
    assert "| starpo-s-bandit | 75.0 [" in md and "| 100.0 |" in md  # ours, then the paper's 1.0
    assert "(n=32); 6.2 before |" in md  # and where it started
    assert "| starpo-s-bandit > starpo-ppo-bandit | Bandit | 50.0 [25.8, 66.6] | reproduced |" in md
    assert "| StarPO vs StarPO-S (Fig. 9) | reproduced (1 of 3 claims run) |" in md
    assert (tmp_path / "ablations" / "fig9.png").stat().st_size > 1000
    assert "## Echo Trap diagnostics" in md and "| starpo-s-bandit-s0 | 3 |" in md


def test_training_change_against_the_runs_own_start(tmp_path):
    # 24/32 after vs 2/32 before: d = 0.6875, Newcombe interval [0.467, 0.813] (from Wilson [.579, .867] and
    # [.017, .201]: 0.6875 - sqrt(.171^2 + .139^2), 0.6875 + sqrt(.117^2 + .045^2))
    up = GridResult("starpo-s-bandit", 0, {"Bandit/success": 0.75, "Bandit/episodes": 32.0}, [],
                    {"val/Bandit/success": 0.0625, "val/Bandit/episodes": 32.0})
    verdict, d, lo, hi = training_change(up, "Bandit")
    assert verdict == "up" and d == pytest.approx(0.6875) and (lo, hi) == pytest.approx((0.467, 0.813), abs=1e-3)
    # 1/32 after vs 3/32 before: d = -0.0625 in [-0.213, 0.078]: not significant at 95%
    flat = GridResult("granularity-1", 0, {"SimpleSokoban/success": 1 / 32, "SimpleSokoban/episodes": 32.0}, [],
                      {"val/SimpleSokoban/success": 3 / 32, "val/SimpleSokoban/episodes": 32.0})
    assert training_change(flat, "SimpleSokoban")[0] == "no change"
    assert training_change(GridResult("x", 0, {"Bandit/success": 0.5, "Bandit/episodes": 8.0}), "Bandit") is None
    md = write_report([up, flat], "cpu-small", tmp_path / "a.md").read_text()
    assert "Of 2 run x tag pairs: 1 up, 0 down, 1 without a significant change." in md
    assert "| starpo-s-bandit-s0 | Bandit | 6.2 | 75.0 | 68.8 [46.7, 81.3] | up |" in md
    assert "Pooled" not in md  # no run has several tags


def test_training_change_pools_a_runs_tags():
    # per tag 3/32 -> 1/32 and 4/32 -> 1/32 are each inside noise; pooled 7/64 -> 2/64 is d = -5/64 = -0.078
    # (Wilson 2/64 [.0086, .1070], 7/64 [.0540, .2090]: lo = -.078 - sqrt(.0227^2 + .0996^2) = -.180,
    #  hi = -.078 + sqrt(.0757^2 + .0554^2) = +.016): still no change.
    # At twice the panel each tag alone is still inside noise; pooled, the run goes down.
    def run(k):
        tags = {"SimpleSokoban": (1, 3), "FrozenLake": (1, 4)}
        ev = {f"{t}/success": a * k / (32 * k) for t, (a, _) in tags.items()} | \
            {f"{t}/episodes": 32.0 * k for t in tags}
        init = {f"val/{t}/success": b * k / (32 * k) for t, (_, b) in tags.items()} | \
            {f"val/{t}/episodes": 32.0 * k for t in tags}
        return GridResult("granularity-2", 0, ev, [], init)

    assert training_change(run(1), "SimpleSokoban")[0] == "no change"
    verdict, d, lo, hi = training_change(run(1), ["SimpleSokoban", "FrozenLake"])
    assert verdict == "no change" and d == pytest.approx(-5 / 64) and (lo, hi) == pytest.approx((-0.180, 0.016),
                                                                                                  abs=2e-3)
    assert [training_change(run(2), t)[0] for t in ("SimpleSokoban", "FrozenLake")] == ["no change", "no change"]
    assert training_change(run(2), ["SimpleSokoban", "FrozenLake"])[0] == "down"
    assert training_change(run(1), ["SimpleSokoban", "Bandit"])[1] == pytest.approx(-2 / 32)  # unscored tags drop
    assert training_change(run(1), ["Bandit"]) is None
    lines = "\n".join(training_effect([run(2)]))
    assert "Of 2 run x tag pairs: 0 up, 0 down, 2 without a significant change. Pooled over each multi-tag " \
           "run's tags (1 run): 0 up, 1 down, 0 without a significant change." in lines
    assert "| granularity-2-s0 | **all 2 tags** | 10.9 | 3.1 | -7.8 [-14.7, -1.5] | **down** |" in lines


@pytest.mark.parametrize("name", sorted(n for n, e in EXPERIMENTS.items() if e.kind == "train"))
def test_every_experiment_resolves_to_a_valid_config_at_its_scales(name):
    for scale in EXPERIMENTS[name].scales:
        r = experiment_settings(name, scale, seed=1, sweep="s")
        cfg = load_config(None, list(r.presets), list(r.overrides))
        assert cfg.trainer.seed == 1 and cfg.tracking.sweep == "s" and cfg.tracking.tags["experiment_name"] == name
        assert cfg.eval.panel == f"data/panels/{scale}.json" and cfg.eval.tags


def test_experiment_knobs_reach_the_config():
    g = load_config(None, *map(list, (experiment_settings("granularity-6", "cpu-small").presets,
                                      experiment_settings("granularity-6", "cpu-small").overrides)))
    assert g.agent.max_actions_per_turn == 6 and g.tag_specs()["SimpleSokoban"].max_actions_per_traj == 30
    o = experiment_settings("online-5", "paper")
    c = load_config(None, list(o.presets), list(o.overrides))
    assert c.envs.train.n_groups == [40] and c.trainer.total_training_steps == 40
    kept = int(c.algorithm.filter_ratio * 40) * c.envs.train.group_size
    assert kept // c.actor.ppo_mini_batch_size == 5  # five updates per rollout
    assert experiment_settings("online-5", "paper").tags["rollout_frequency"] == "5"
    with pytest.raises(KeyError, match="does not run at scale cpu-small"):
        experiment_settings("diversity-r32", "cpu-small")
    with pytest.raises(KeyError, match="did you mean 'granularity-5'"):
        experiment_settings("granularity5", "cpu-small")


def test_grid_block_round_trips_and_bad_blocks_are_named(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text(grid_yaml(Grid(seeds=(0, 1), run=("online-1",), overrides=("actor.lr=1e-5",))))
    g = read_grid(p)
    assert g.runs() == [("online-1", 0), ("online-1", 1)] and g.overrides == ("actor.lr=1e-5",)
    assert g.sweep_name == "ablations-cpu-small"
    p.write_text("experiments: {scale: gpu}\n")
    with pytest.raises(KeyError, match=r"experiments\.scale='gpu'"):
        read_grid(p)
    p.write_text("experiments: {runs: [online-1]}\n")
    with pytest.raises(KeyError, match="unknown key"):
        read_grid(p)
    p.write_text("experiments: {overrides: [a=[1]]}\n")
    with pytest.raises(KeyError, match="is not valid YAML"):
        read_grid(p)
    p.write_text(json.dumps({"experiments": {"run": ["diversity-r32"]}}))
    with pytest.raises(KeyError, match="does not run at scale"):
        read_grid(p)


@pytest.mark.unit
def test_paired_bootstrap_by_hand():
    """Two seeds with differences 0 and 1: a resample of both is {0,0}, {0,1}, {1,0} or {1,1}, so its mean is
    0 (1/4), 0.5 (1/2) or 1 (1/4); the 2.5% and 97.5% points are 0 and 1. Equal differences have no spread."""
    from ragen.eval.stats import paired_bootstrap

    assert paired_bootstrap([0.0, 1.0]) == (0.5, 0.0, 1.0)
    assert paired_bootstrap([0.25] * 10) == (0.25, 0.25, 0.25)
    assert paired_bootstrap([1, 0, 0, 1, -1, 1, 0, 1], seed=3) == paired_bootstrap([1, 0, 0, 1, -1, 1, 0, 1], seed=3)
    m, lo, hi = paired_bootstrap([1.0] * 30 + [0.0] * 70)  # 30% of seeds gained: about 0.3 +- 1.96 * 0.046
    assert m == pytest.approx(0.3) and lo == pytest.approx(0.21, abs=0.02) and hi == pytest.approx(0.39, abs=0.02)
    assert all(math.isnan(x) for x in paired_bootstrap([]))


@pytest.mark.unit
def test_mcnemar_exact_by_hand():
    """1 seed lost and 6 gained: 2 * P(X <= 1), X ~ Bin(7, 1/2) = 2 * (1 + 7) / 128 = 0.125; 0 vs 5: 2/32."""
    from ragen.eval.stats import mcnemar_exact

    assert mcnemar_exact(6, 1) == pytest.approx(0.125)
    assert mcnemar_exact(1, 6) == pytest.approx(0.125)
    assert mcnemar_exact(5, 0) == pytest.approx(0.0625)
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


@pytest.mark.unit
def test_paired_power_by_hand():
    """Phi(0.1 sqrt(n) / sd - 1.96): n = 100, sd = 0.5 gives Phi(0.04) = 0.516; sd = 0.25 gives Phi(2.04) =
    0.979; no spread finds any effect."""
    from ragen.eval.stats import paired_power

    assert paired_power(0.5, 100) == pytest.approx(0.5160, abs=1e-4)
    assert paired_power(0.25, 100) == pytest.approx(0.9793, abs=1e-4)
    assert paired_power(0.0, 10) == 1.0 and math.isnan(paired_power(0.5, 0))


@pytest.mark.unit
def test_paired_change_pairs_by_seed():
    """Seeds 1-4 sampled twice before and after: per-seed rates (0, .5, 1, 0) -> (1, .5, 1, .5), differences
    (1, 0, 0, .5), mean 0.375; no McNemar at two samples per seed. A panel that changed is refused."""
    import pandas as pd

    from ragen.run.learn_bench import paired_change

    def frame(successes):
        return pd.DataFrame({"seed": [1, 1, 2, 2, 3, 3, 4, 4], "tag": "T", "success": successes})

    before, after = frame([0, 0, 1, 0, 1, 1, 0, 0]), frame([1, 1, 0, 1, 1, 1, 1, 0])
    p = paired_change(before, after)
    assert p["paired_n"] == 4 and p["samples_per_seed"] == 2 and p["paired_diff"] == pytest.approx(0.375)
    assert "mcnemar_p" not in p and 0 < p["power_10pp"] < 1
    one = paired_change(before[before.index % 2 == 0], after[after.index % 2 == 0])  # first sample of each seed
    assert (one["gained"], one["lost"]) == (2, 1) and one["mcnemar_p"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="different seeds"):
        paired_change(before, after.assign(seed=after["seed"] + 10))
