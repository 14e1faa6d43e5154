"""Named experiments: the paper's ablations (docs/evaluation.md, experiments) as sets of presets and overrides,
and which pipeline runs each (``train`` for RL, ``sft`` for a supervised warm-start).

An experiment is scale-free where it can be; ``scale_overrides`` hold what a scale must change (group counts,
iterations). A scale is a preset (``cpu-small``: this 2-core machine, minutes per experiment; ``paper``: one GPU,
Qwen2.5-0.5B, 200 iterations) plus the grid settings of ``SCALES``. ``experiment_settings`` turns (experiment,
scale, seed, extra overrides) into the presets and overrides of one run; ``knobs`` become MLflow tags so the UI's
compare view lines the runs of one ablation up."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Experiment:
    name: str
    kind: str  # train | sft
    presets: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    description: str = ""
    finding: str = ""  # the paper's table or figure (a key of ragen.report.paper.FINDINGS)
    knobs: Mapping[str, str] = field(default_factory=dict)
    scale_overrides: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    scales: tuple[str, ...] = ("cpu-small", "paper")  # where it can run


@dataclass(frozen=True)
class Scale:
    """A grid scale: the preset under every experiment, overrides for all of them, the eval panel size."""

    preset: str
    overrides: tuple[str, ...]
    iterations: int  # trainer.total_training_steps of an Online-1 run


# the ablations measure the paper's algorithms as they are: no collapse guard rolling a run back, and a kept
# group without reward variance still trained on (the original)
PAPER_FAITHFUL = ("guard.enabled=false", "algorithm.zero_variance_groups=keep")
SCALES: dict[str, Scale] = {
    # One update per rollout as the paper (filter 25% of 8 groups x 8 keeps 16 = one mini-batch); a 32-seed panel
    # per tag every 5 iterations; no checkpoints kept beyond the last (the grid keeps metrics, not weights).
    "cpu-small": Scale("cpu-small", ("actor.ppo_mini_batch_size=16", "critic.ppo_mini_batch_size=16",
                                     "trainer.test_freq=5", "trainer.checkpoint_every=1000",
                                     "eval.panel=data/panels/cpu-small.json", *PAPER_FAITHFUL), 10),
    "paper": Scale("paper", ("eval.panel=data/panels/paper.json", *PAPER_FAITHFUL), 200),
}

BANDIT = ("envs.train.tags=[Bandit]", "agent.max_turn=1", "agent.max_actions_per_turn=1",
          "eval.tags=[Bandit,BanditTest,BanditTestRev]")
# The multi-turn envs think, as the paper's runs (the cpu-small preset turns thinking off for Bandit); on the
# bundled CPU model that means RL starts from the SFT warm-start (model.warm_start=auto): without it not one of 32
# no-think Sokoban rollouts was well-formed (every turn a format error, reward std 0: nothing to learn from).
SOKOBAN = ("envs.train.tags=[SimpleSokoban]", "agent.max_turn=5", "agent.max_actions_per_turn=5",
           "agent.enable_think=true",
           "eval.tags=[SimpleSokoban,LargerSokoban,SokobanDifferentGridVocab,FrozenLake]")
FROZENLAKE = ("envs.train.tags=[FrozenLake]", "agent.max_turn=5", "agent.max_actions_per_turn=5",
              "agent.enable_think=true", "eval.tags=[FrozenLake]")
ENVS = {"bandit": BANDIT, "sokoban": SOKOBAN, "frozenlake": FROZENLAKE}
# Multi-turn envs at cpu-small: a thinking turn fits 96 tokens; the update runs without recomputation (a 5-turn
# trajectory is ~1k tokens: an update on 8 of them took 143 s here with checkpointing), validation only before
# and after training. (The update computes in bf16 by default now; these runs always did.)
MULTI_TURN_CPU = ("rollout.response_length=96", "actor.gradient_checkpointing=false",
                  "critic.gradient_checkpointing=false", "trainer.test_freq=10")
# ... and a quarter of Bandit's batch: 4 groups x 4 rollouts, the 25% filter keeps one group = one update of 4.
SMALL_BATCH_CPU = ("envs.train.n_groups=[4]", "envs.train.group_size=4", "actor.ppo_mini_batch_size=4",
                   "critic.ppo_mini_batch_size=4")


def _env_scale(env: str) -> dict[str, tuple[str, ...]]:
    return {} if env == "bandit" else {"cpu-small": (*MULTI_TURN_CPU, *SMALL_BATCH_CPU)}


def _starpo_vs_s() -> list[Experiment]:
    """Fig. 5 (PPO vs GRPO under vanilla StarPO) and Fig. 9 (StarPO vs StarPO-S) on the three envs."""
    out = []
    for env, over in ENVS.items():
        for algo, presets, desc in (("starpo-ppo", ("starpo",), "vanilla StarPO, PPO (critic, GAE), KL 0.001"),
                                    ("starpo-grpo", ("starpo-grpo",), "vanilla StarPO, GRPO, KL loss 0.001"),
                                    ("starpo-s", ("starpo-s",), "StarPO-S: filter 25%, clip-higher, no KL")):
            out.append(Experiment(f"{algo}-{env}", "train", presets, over, f"{desc}, on {env}",
                                  "fig9" if algo != "starpo-grpo" else "fig5",
                                  {"algorithm": algo, "env": env}, _env_scale(env)))
    return out


def _filter_ratio() -> list[Experiment]:
    """Fig. 7: StarPO-S (PPO) on FrozenLake keeping 100 / 75 / 50 / 25% of the groups."""
    return [Experiment(f"filter-{int(r * 100)}-frozenlake", "train", ("starpo-s",),
                       (*FROZENLAKE, f"algorithm.filter_ratio={r}"), f"variance filter keeps {r:.0%} of groups",
                       "fig7", {"filter_ratio": str(r), "env": "frozenlake"}, _env_scale("frozenlake"))
            for r in (1.0, 0.75, 0.5, 0.25)]


def _kl_clip() -> list[Experiment]:
    """Fig. 8: PPO without filtering; base (KL 0.001, clip 0.2) vs clip-higher 0.28 vs no KL."""
    variants = (("base", ()), ("clip-high", ("actor.clip_ratio_high=0.28",)),
                ("no-kl", ("algorithm.use_kl_in_reward=false", "algorithm.kl_coef=0.0")))
    return [Experiment(f"ppo-{v}-{env}", "train", ("starpo",), (*ENVS[env], *extra),
                       f"PPO, no filter: {v}", "fig8", {"variant": v, "env": env}, _env_scale(env))
            for env in ("sokoban", "frozenlake") for v, extra in variants]


def _diversity() -> list[Experiment]:
    """Table 2: groups x responses at a fixed batch (paper 128, cpu-small 64), StarPO-S on SimpleSokoban. At
    cpu-small 32 responses per prompt leaves 2 groups, of which the 25% filter keeps none: that row is paper-only."""
    out = []
    for r in (32, 16, 8, 4, 2, 1):
        scale = {"paper": (f"envs.train.n_groups=[{128 // r}]", f"envs.train.group_size={r}"),
                 "cpu-small": (*MULTI_TURN_CPU, f"envs.train.n_groups=[{64 // r}]", f"envs.train.group_size={r}")}
        out.append(Experiment(f"diversity-r{r}", "train", ("starpo-s",), SOKOBAN,
                              f"{r} response{'s' if r > 1 else ''} per prompt at a fixed batch", "table2",
                              {"responses_per_prompt": str(r), "env": "sokoban"}, scale,
                              ("cpu-small", "paper") if r <= 16 else ("paper",)))
    return out


def _granularity() -> list[Experiment]:
    """Table 3: max_actions_per_turn k = 1..7 with a budget of 5k actions, 5 turns, StarPO-S on SimpleSokoban."""
    out = []
    for k in range(1, 8):
        budget = "{" + ", ".join(f"{t}: {{max_actions_per_traj: {5 * k}}}" for t in
                                 ("SimpleSokoban", "LargerSokoban", "SokobanDifferentGridVocab", "FrozenLake")) + "}"
        out.append(Experiment(f"granularity-{k}", "train", ("starpo-s",),
                              (*SOKOBAN, f"agent.max_actions_per_turn={k}", f"envs.custom={budget}"),
                              f"up to {k} action{'s' if k > 1 else ''} per turn, {5 * k} per episode", "table3",
                              {"max_actions_per_turn": str(k), "env": "sokoban"}, _env_scale("sokoban")))
    return out


def _rollout_frequency() -> list[Experiment]:
    """Fig. 10: Online-k reuses one rollout for k updates: a k-times larger rollout with the same 25% filter
    (train_all.sh), for 1/k of the iterations so every variant makes the same number of updates (cpu-small: 4k
    groups of 4, one group kept per update)."""
    out = []
    for k in (1, 2, 5, 10):
        scale = {name: (*((*MULTI_TURN_CPU, *SMALL_BATCH_CPU) if name == "cpu-small" else ()),
                        f"envs.train.n_groups=[{groups * k}]",
                        f"trainer.total_training_steps={max(1, s.iterations // k)}",
                        f"trainer.test_freq={max(1, min(10, s.iterations // k))}")
                 for name, s in SCALES.items() for groups in [4 if name == "cpu-small" else 8]}
        out.append(Experiment(f"online-{k}", "train", ("starpo-s",), SOKOBAN,
                              f"one rollout per {k} update(s)", "fig10",
                              {"rollout_frequency": str(k), "env": "sokoban"}, scale))
    return out


def _think() -> list[Experiment]:
    """Table 4 / Fig. 11: StarPO-S with and without thinking, on Bandit and SimpleSokoban. With thinking the
    cpu-small scale starts from the SFT warm-start (model.warm_start=auto) and allows 96 tokens per turn."""
    out = []
    for env in ("bandit", "sokoban"):
        for think in (True, False):
            scale = {"cpu-small": (*(() if env == "bandit" else (*MULTI_TURN_CPU, *SMALL_BATCH_CPU)),
                                   *(("rollout.response_length=96",) if think else
                                     ("rollout.response_length=48",) if env != "bandit" else ()))}
            out.append(Experiment(f"{'think' if think else 'nothink'}-{env}", "train", ("starpo-s",),
                                  (*ENVS[env], f"agent.enable_think={str(think).lower()}"),
                                  f"StarPO-S {'with' if think else 'without'} thinking on {env}", "table4",
                                  {"think": str(think).lower(), "env": env}, scale))
    return out


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    *_starpo_vs_s(), *_filter_ratio(), *_kl_clip(), *_diversity(), *_granularity(), *_rollout_frequency(),
    *_think(),
    Experiment("sft-baseline", "sft", ("paper", "sft-paper"),
               description="the paper's SFT baseline (App. C): LoRA r=64, alpha=32, lr 1e-4, 1000/100 BFS demos "
                           "on SimpleSokoban and FrozenLake; paper: 74.6% Sokoban, 23% FrozenLake success"),
    Experiment("sft-baseline-cpu", "sft", ("cpu-small", "sft-paper"), ("sft.n_train=128", "sft.n_test=16"),
               description="the SFT baseline's recipe on the bundled CPU model, at a size this machine trains"),
)}

# The cpu-small grid this machine runs by default (`dvc repro`): StarPO vs StarPO-S on Bandit, and the
# granularity and rollout-frequency sweeps on SimpleSokoban.
DEFAULT_GRID = ("starpo-ppo-bandit", "starpo-s-bandit", *(f"granularity-{k}" for k in range(1, 8)),
                *(f"online-{k}" for k in (1, 2, 5, 10)))


def get_experiment(name: str, kind: str | None = None) -> Experiment:
    if name not in EXPERIMENTS:
        close = difflib.get_close_matches(name, list(EXPERIMENTS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"unknown experiment {name!r}{hint}; known: {', '.join(sorted(EXPERIMENTS))}")
    e = EXPERIMENTS[name]
    if kind is not None and e.kind != kind:
        raise KeyError(f"experiment {name!r} is a {e.kind} experiment, not {kind}")
    return e


@dataclass(frozen=True)
class Resolved:
    """One run of the grid: presets and overrides for ``load_config``, its run name and MLflow tags."""

    experiment: Experiment
    scale: str
    seed: int
    presets: tuple[str, ...]
    overrides: tuple[str, ...]
    run_name: str
    tags: Mapping[str, str]


def experiment_settings(name: str, scale: str, seed: int = 0, extra: Sequence[str] = (),
                        sweep: str | None = None) -> Resolved:
    """Experiment ``name`` at ``scale`` with ``trainer.seed=seed``; ``extra`` (grid-wide overrides, e.g. a tiny
    model in tests) comes last. An experiment without settings for a scale is an error naming the scales it has."""
    e = get_experiment(name, "train")
    if scale not in SCALES:
        raise KeyError(f"unknown scale {scale!r}; known: {', '.join(SCALES)}")
    if scale not in e.scales:
        raise KeyError(f"experiment {name!r} does not run at scale {scale} (only {', '.join(e.scales)})")
    s = SCALES[scale]
    tags = {"experiment_name": name, "scale": scale, "seed": str(seed), "finding": e.finding, **e.knobs}
    overrides = (*s.overrides, *e.overrides, *e.scale_overrides.get(scale, ()), f"trainer.seed={seed}",
                 f"tracking.tags={json.dumps(tags)}", *([f"tracking.sweep={sweep}"] if sweep else []), *extra)
    return Resolved(e, scale, seed, (s.preset, *e.presets), overrides, f"{name}-s{seed}", tags)


# -- the grid that `dvc repro` runs: the ``experiments`` block of params.yaml ------------------------------------
@dataclass(frozen=True)
class Grid:
    scale: str = "cpu-small"
    seeds: tuple[int, ...] = (0,)
    run: tuple[str, ...] = DEFAULT_GRID
    sweep: str = "ablations"  # MLflow parent run; the scale is appended
    overrides: tuple[str, ...] = ()  # after every experiment's own (e.g. a tiny model in tests)

    @property
    def sweep_name(self) -> str:
        return f"{self.sweep}-{self.scale}"

    def runs(self) -> list[tuple[str, int]]:
        return [(n, s) for n in self.run for s in self.seeds]

    def settings(self, name: str, seed: int) -> Resolved:
        return experiment_settings(name, self.scale, seed, self.overrides, self.sweep_name)

    def run_of_item(self, item: str) -> tuple[str, int]:
        """The (experiment, seed) whose matrix item is ``item`` (``<experiment>-<seed>``, what follows ``@`` in a
        stage name such as ``ablation-train@granularity-1-0``): the stage commands take the stage's name from the
        environment instead of params spliced into a shell command line."""
        match = [(n, s) for n, s in self.runs() if f"{n}-{s}" == item]
        if len(match) != 1:
            raise KeyError(f"{item!r} is not one run of the grid (<experiment>-<seed>); the grid's runs: "
                           f"{', '.join(f'{n}-{s}' for n, s in self.runs())}")
        return match[0]

    def to_dict(self) -> dict:
        return {"scale": self.scale, "seeds": list(self.seeds), "run": list(self.run), "sweep": self.sweep,
                "overrides": list(self.overrides)}


def read_grid(params: str | Path = "params.yaml") -> Grid:
    """The ``experiments`` block of a params file, checked (unknown names and keys are errors naming the fix)."""
    import yaml

    from ragen.config import PARAMS_COMMAND

    path = Path(params)
    try:
        raw = (yaml.safe_load(path.read_text()) or {}).get("experiments") if path.is_file() else None
    except yaml.YAMLError as e:
        raise KeyError(f"{path} is not valid YAML ({e}); fix it or regenerate it with "
                       f"`{PARAMS_COMMAND}`") from None
    if raw is None:
        raise KeyError(f"{path} has no 'experiments' block; regenerate it with "
                       f"`{PARAMS_COMMAND}`")
    unknown = set(raw) - set(Grid().to_dict())
    if unknown:
        raise KeyError(f"{path}: experiments has unknown key(s) {sorted(unknown)}; allowed: {sorted(Grid().to_dict())}")
    g = Grid(scale=str(raw.get("scale", "cpu-small")), seeds=tuple(int(s) for s in raw.get("seeds", [0])),
             run=tuple(raw.get("run", DEFAULT_GRID)), sweep=str(raw.get("sweep", "ablations")),
             overrides=tuple(str(o) for o in raw.get("overrides") or ()))
    if g.scale not in SCALES:
        raise KeyError(f"{path}: experiments.scale={g.scale!r}; known: {', '.join(SCALES)}")
    for name in g.run:
        e = get_experiment(name, "train")
        if g.scale not in e.scales:
            raise KeyError(f"{path}: experiment {name!r} does not run at scale {g.scale} (only {', '.join(e.scales)})")
    return g


def grid_yaml(grid: Grid | None = None) -> str:
    """The ``experiments`` block of params.yaml, commented (what `ragen config params` appends)."""
    g = grid or Grid()
    runs = "".join(f"    - {n}\n" for n in g.run)
    return ("# The ablation grid `dvc repro` runs (ablation-train@ -> ablation-eval@ per experiment and seed, then\n"
            "# report); `ragen experiments list` names them all. One-off variation:\n"
            "# dvc exp run -S \"experiments.overrides=['actor.lr=1e-5']\" report\n"
            "experiments:\n"
            f"  scale: {g.scale}  # cpu-small (this machine: minutes per experiment) | paper (one GPU, 200 steps)\n"
            f"  seeds: {json.dumps(list(g.seeds))}  # trainer.seed of each experiment's runs\n"
            f"  sweep: {g.sweep}  # MLflow parent run <sweep>-<scale>; every run is its child\n"
            f"  overrides: {json.dumps(list(g.overrides))}  # key=value applied to every experiment, last\n"
            f"  run:  # experiments to run\n{runs}")
