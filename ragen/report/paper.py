"""The paper's numbers (its tables and figures) per finding, and the claims the ablation report checks ours
against.

``values`` are the paper's success rates per (experiment, eval tag): exact table entries where the paper has a
table, approximate curve readings (final values) for figures. ``claims`` are the orderings a finding asserts:
(better experiment, worse experiment, eval tag)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    key: str
    title: str
    statement: str
    tags: tuple[str, ...]  # eval tags shown in the table
    values: dict[tuple[str, str], float] = field(default_factory=dict)
    claims: tuple[tuple[str, str, str], ...] = ()
    source: str = "table"  # table: exact entries; figure: approximate readings of a curve's end
    note: str = ""  # what a reader must know to compare ours with the paper's (printed under the statement)


_SOKO = ("SimpleSokoban", "SokobanDifferentGridVocab", "LargerSokoban", "FrozenLake")

FINDINGS: dict[str, Finding] = {f.key: f for f in (
    Finding("fig9", "StarPO vs StarPO-S (Fig. 9)",
            "StarPO-S ends above vanilla StarPO (PPO), which collapses on all three envs.",
            ("Bandit", "SimpleSokoban", "FrozenLake"),
            {("starpo-ppo-bandit", "Bandit"): 0.0, ("starpo-s-bandit", "Bandit"): 1.0,
             ("starpo-ppo-sokoban", "SimpleSokoban"): 0.0, ("starpo-s-sokoban", "SimpleSokoban"): 0.203,
             ("starpo-ppo-frozenlake", "FrozenLake"): 0.0, ("starpo-s-frozenlake", "FrozenLake"): 0.218},
            (("starpo-s-bandit", "starpo-ppo-bandit", "Bandit"),
             ("starpo-s-sokoban", "starpo-ppo-sokoban", "SimpleSokoban"),
             ("starpo-s-frozenlake", "starpo-ppo-frozenlake", "FrozenLake")), "figure"),
    Finding("fig5", "PPO vs GRPO under vanilla StarPO (Fig. 5)",
            "GRPO collapses first on Bandit and Sokoban; on FrozenLake GRPO is the more stable one.",
            ("Bandit", "SimpleSokoban", "FrozenLake"),
            {("starpo-ppo-bandit", "Bandit"): 0.2, ("starpo-grpo-bandit", "Bandit"): 0.0,
             ("starpo-ppo-sokoban", "SimpleSokoban"): 0.0, ("starpo-grpo-sokoban", "SimpleSokoban"): 0.0,
             ("starpo-ppo-frozenlake", "FrozenLake"): 0.0, ("starpo-grpo-frozenlake", "FrozenLake"): 0.22},
            (("starpo-ppo-bandit", "starpo-grpo-bandit", "Bandit"),
             ("starpo-grpo-frozenlake", "starpo-ppo-frozenlake", "FrozenLake")), "figure"),
    Finding("fig7", "Variance filter ratio on FrozenLake, PPO (Fig. 7)",
            "Keeping fewer, higher-variance groups delays or avoids collapse (50% and 25% stay near 0.2).",
            ("FrozenLake",),
            {("filter-100-frozenlake", "FrozenLake"): 0.0, ("filter-50-frozenlake", "FrozenLake"): 0.2,
             ("filter-25-frozenlake", "FrozenLake"): 0.22},
            (("filter-25-frozenlake", "filter-100-frozenlake", "FrozenLake"),
             ("filter-50-frozenlake", "filter-100-frozenlake", "FrozenLake")), "figure"),
    Finding("fig8", "KL removal and clip-higher, PPO without filtering (Fig. 8)",
            "Dropping the KL term and raising the upper clip both beat the base PPO (peak values).",
            ("SimpleSokoban", "FrozenLake"),
            {("ppo-base-sokoban", "SimpleSokoban"): 0.08, ("ppo-clip-high-sokoban", "SimpleSokoban"): 0.117,
             ("ppo-no-kl-sokoban", "SimpleSokoban"): 0.11, ("ppo-base-frozenlake", "FrozenLake"): 0.226,
             ("ppo-clip-high-frozenlake", "FrozenLake"): 0.20, ("ppo-no-kl-frozenlake", "FrozenLake"): 0.21},
            (("ppo-clip-high-sokoban", "ppo-base-sokoban", "SimpleSokoban"),
             ("ppo-no-kl-sokoban", "ppo-base-sokoban", "SimpleSokoban")), "figure"),
    Finding("table2", "Task diversity: responses per prompt at a fixed batch (Table 2)",
            "More distinct prompts help while each keeps several rollouts; 4 per prompt is best.",
            ("SimpleSokoban", "SokobanDifferentGridVocab", "FrozenLake"),
            {**{(f"diversity-r{r}", t): v for r, vals in {
                32: (0.2109, 0.2022, 0.1797), 16: (0.2031, 0.2148, 0.1953), 8: (0.2031, 0.1953, 0.1719),
                4: (0.2070, 0.2539, 0.2148), 2: (0.1992, 0.2500, 0.1250), 1: (0.1953, 0.2227, 0.1250)}.items()
                for t, v in zip(("SimpleSokoban", "SokobanDifferentGridVocab", "FrozenLake"), vals, strict=True)}},
            (("diversity-r4", "diversity-r1", "FrozenLake"),
             ("diversity-r4", "diversity-r16", "SokobanDifferentGridVocab"))),
    Finding("table3", "Interaction granularity: actions per turn (Table 3)",
            "5-6 actions per turn is best; 1 is worst and 7 degrades again.", _SOKO,
            {(f"granularity-{k}", t): v for k, vals in {
                1: (0.1211, 0.1367, 0.0117, 0.1172), 2: (0.1641, 0.2109, 0.0352, 0.1836),
                3: (0.1953, 0.1953, 0.0195, 0.2088), 4: (0.2695, 0.2695, 0.0508, 0.2070),
                5: (0.2813, 0.2578, 0.0625, 0.2109), 6: (0.3359, 0.3164, 0.0664, 0.1836),
                7: (0.2227, 0.2852, 0.0391, 0.1953)}.items()
             for t, v in zip(("SimpleSokoban", "SokobanDifferentGridVocab", "LargerSokoban", "FrozenLake"), vals,
                             strict=True)},
            (("granularity-5", "granularity-1", "SimpleSokoban"),
             ("granularity-6", "granularity-7", "SimpleSokoban")),
            note="The grid keeps the paper's rewards, under which a malformed turn (format penalty -0.1) and a "
                 "turn of one valid Sokoban move (step cost -0.1) score the same at 1 action per turn, and a bad "
                 "turn costs less than a full valid one from 2 on: at low granularity the reward cannot tell "
                 "format errors from moves. A penalty above 0.1 x max_actions_per_turn keeps them apart at every "
                 "granularity; the cpu-sokoban preset uses -0.6."),
    Finding("fig10", "Rollout frequency: Online-k (Fig. 10)",
            "Fresher rollouts generalise better: Online-1 is best and Online-10 worst.",
            ("SimpleSokoban", "SokobanDifferentGridVocab", "FrozenLake"),
            {("online-1", "SimpleSokoban"): 0.2, ("online-1", "SokobanDifferentGridVocab"): 0.25,
             ("online-1", "FrozenLake"): 0.2, ("online-10", "FrozenLake"): 0.05},
            (("online-1", "online-10", "SimpleSokoban"), ("online-1", "online-10", "FrozenLake"),
             ("online-1", "online-5", "SimpleSokoban")), "figure"),
    Finding("table4", "Reasoning vs no-think (Table 4)",
            "Thinking helps symbolic generalisation on Bandit; in multi-turn Sokoban it gives little.",
            ("BanditTest", "BanditTestRev", "FrozenLake", "LargerSokoban", "SimpleSokoban",
             "SokobanDifferentGridVocab"),
            {("think-bandit", "BanditTest"): 1.0, ("think-bandit", "BanditTestRev"): 0.6758,
             ("nothink-bandit", "BanditTest"): 0.8125, ("nothink-bandit", "BanditTestRev"): 0.5625,
             **{(e, t): v for e, vals in {"think-sokoban": (0.1992, 0.0234, 0.2148, 0.1875),
                                          "nothink-sokoban": (0.1953, 0.0273, 0.2073, 0.2617)}.items()
                for t, v in zip(("FrozenLake", "LargerSokoban", "SimpleSokoban", "SokobanDifferentGridVocab"),
                                vals, strict=True)}},
            (("think-bandit", "nothink-bandit", "BanditTest"), ("think-bandit", "nothink-bandit", "BanditTestRev"))),
)}
