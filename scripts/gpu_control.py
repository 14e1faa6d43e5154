"""The SimpleSokoban one-room positive control on SmolLM2 with the HF engine, on a GPU machine: the second prepared
device call, after `make gpu-check` (`make gpu-control`).

The model travels as the bundled GGUF file (98 MB) in two parts, since one call carries at most 64 MiB: `make
gpu-bundle` writes part 1 into .gpu/ (carried by the gpu-check call, and left on the machine) and part 2 into
.gpu-model/ (carried by this call, on the same machine while it is still held). The parts are joined and checked
against the sha256 of the whole file, dequantized into the model cache (transformers and the carried gguf wheel),
and the control runs as `ragen bench learn` runs it: the SFT warm-start made first, then one SimpleSokoban room
(seed 145) trained with 2 groups x 8 rollouts for 10 updates and scored 64 times before, after update 5 and at the
end. The settings are the CPU control's (docs/benchmarks.md, "Multi-turn positive controls"), with the HF engine in
place of vLLM, which the GPU machine lacks.

Prints one JSON object (the measurement's before/after per tag, its timings, the device) and writes it to --out.
--tiny runs the same path on the tiny model in a minute (the suite runs it on the CPU with --allow-cpu).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout, also when it travels as source without an install

MANIFEST = ROOT / ".gpu" / "smollm2-gguf" / "manifest.json"  # written by `make gpu-bundle` with part 1
SEED = 145  # the CPU control's room: the warm-start solved it 39% of the time there
# The CPU control's settings (commit 6acd4b6's cpu-sokoban preset, since moved to GRPO over 16 rooms): PPO with a
# critic warmed up for 2 value-only updates, one room in 2 groups of 8, every group kept, the panel every 5 updates
CONTROL = (f"envs.train_seeds=[{SEED}]", "envs.train.n_groups=[2]", "envs.train.group_size=8",
           "algorithm.filter_ratio=1.0", "algorithm.adv_estimator=gae", "algorithm.reward_norm_method=identity",
           "algorithm.kl_monitor_size=0", "trainer.critic_warmup=2", "trainer.checkpoint_every=10",
           "eval.pass_k=64", "trainer.test_freq=5", "rollout.engine=hf")
ITERATIONS = 10
# --tiny: the same path at the smallest size (the tiny model's SFT too)
TINY = ("model.base=tiny-random-llama", "model.dtype=fp32", "envs.train.n_groups=[1]", "envs.train.group_size=2",
        "actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2", "agent.max_turn=2",
        "eval.pass_k=2", "trainer.critic_warmup=0", "sft.n_train=6", "sft.n_test=2",
        "sft.mini_batch_size=3", "sft.tags=[SimpleSokoban]")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split_file(src: Path, parts: list[tuple[Path, int | None]], manifest: Path) -> dict[str, Any]:
    """Cut ``src`` into ``parts`` (path, bytes; ``None``: the rest) and write the manifest that ``join_parts``
    checks: the whole file's name, size and sha256, and each part's."""
    record: dict[str, Any] = {"name": src.name, "bytes": src.stat().st_size, "sha256": sha256(src), "parts": []}
    with src.open("rb") as f:
        for path, size in parts:
            data = f.read() if size is None else f.read(size)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            record["parts"].append({"file": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
                                    "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        if f.read(1):
            raise ValueError(f"{src}: the parts hold less than the file")
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps(record, indent=1) + "\n")
    return record


def join_parts(manifest: Path, dest_dir: Path, root: Path = ROOT) -> Path:
    """The file of ``manifest`` rebuilt from its parts in ``dest_dir``; a missing or damaged part, or a whole that
    differs, is refused naming it."""
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest} not found: `make gpu-bundle` writes it with part 1 of the model, and "
                                f"the gpu-check call carries it (.gpu)")
    record = json.loads(manifest.read_text())
    dest = dest_dir / record["name"]
    if dest.is_file() and dest.stat().st_size == record["bytes"] and sha256(dest) == record["sha256"]:
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    try:
        with tmp.open("wb") as out:
            for i, part in enumerate(record["parts"], 1):
                path = root / part["file"]
                if not path.is_file():
                    raise FileNotFoundError(
                        f"part {i} of {record['name']} is missing: {path}. Part 1 travels with .gpu (the gpu-check "
                        f"call), part 2 with .gpu-model (the gpu-control call), to the same machine while it is held")
                data = path.read_bytes()
                if len(data) != part["bytes"] or hashlib.sha256(data).hexdigest() != part["sha256"]:
                    raise ValueError(f"part {i} of {record['name']} ({path}) is damaged: its size or sha256 differs "
                                     f"from {manifest}; run `make gpu-bundle` again")
                out.write(data)
        if sha256(tmp) != record["sha256"]:
            raise ValueError(f"the parts of {record['name']} join into a file whose sha256 differs from {manifest}")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(dest)
    return dest


def control_overrides(work: Path, tiny: bool) -> list[str]:
    """The control's settings, with every file it writes (SFT demos and checkpoint) under ``work``."""
    return [*CONTROL, *(TINY if tiny else ()), f"sft.demos={work / 'sft' / 'demos.parquet'}",
            f"sft.output={work / 'sft' / 'warmstart'}"]


def write_panel(work: Path) -> Path:
    path = work / "panel.json"
    path.write_text(json.dumps({"name": f"control-sokoban-{SEED}", "seeds": {"SimpleSokoban": [SEED]}}))
    return path


def run_control(work: Path, *, tiny: bool, iterations: int) -> dict[str, Any]:
    from ragen.report.learning_curve import add_figure
    from ragen.run.learn_bench import LearnSpec, bench_learn

    spec = LearnSpec(params=str(ROOT / "params.yaml"), presets=("cpu-sokoban",),
                     overrides=tuple(control_overrides(work, tiny)), iterations=iterations,
                     panel=str(write_panel(work)), out=str(work / "control"))
    bench_learn(spec)
    return add_figure(Path(spec.out))


def control(work: Path, *, tiny: bool, iterations: int) -> dict[str, Any]:
    """The model joined from its parts (SmolLM2), then the control: its numbers for the report."""
    out: dict[str, Any] = {}
    if not tiny:
        from ragen.models.smollm2 import GGUF_ENV

        tj = time.perf_counter()
        os.environ[GGUF_ENV] = str(join_parts(MANIFEST, work / "gguf"))
        out["model_join_s"] = round(time.perf_counter() - tj, 1)
    result = run_control(work, tiny=tiny, iterations=iterations)
    return {**out, "tags": result["tags"], "iterations": result["iterations"],
            "warm_start_build_s": round(result["warm_start_build_s"], 1), "rl_wall_s": round(result["wall_s"], 1),
            "s_per_iteration": result.get("s_per_iteration"), "update_share": result.get("update_share"),
            "rollout_share": result.get("rollout_share")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--work", type=Path, help="scratch folder (default: a temporary one, removed after)")
    p.add_argument("--allow-cpu", action="store_true", help="run on the CPU where CUDA is absent (the suite does)")
    p.add_argument("--tiny", action="store_true", help="the tiny model (no GGUF parts needed), smallest shapes")
    p.add_argument("--iterations", type=int, default=ITERATIONS, help=f"updates (default {ITERATIONS})")
    args = p.parse_args(argv)

    import torch
    from gpu_check import emit, refused_without_cuda, run_step

    if refused_without_cuda("gpu-control", args.allow_cpu, "(with --tiny: the SmolLM2 control takes hours on a CPU)"):
        return 2
    cuda = torch.cuda.is_available()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ragen-gpu-control-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        step = run_step("control", lambda: control(work, tiny=args.tiny, iterations=args.iterations), cuda,
                        tool="gpu-control")
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "model": "tiny" if args.tiny else "smollm2", **step, "seconds": round(time.perf_counter() - t0, 1)}
    return emit(report, args.out)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
