"""The GPU path, checked end to end on the tiny model with the HF engine (`make gpu-check`; issue 27).

Steps, each timed with its peak GPU memory, printed as one JSON object (and written to --out):
  zero0-bf16  two iterations of the plain loop on DeepSpeed ZeRO-0 in bf16: the sync gate's calibration when the run
              opens, rollouts, the update, the weight sync into the engine (gated), a checkpoint after each iteration
  resume      the same run continued to a third iteration from its saved checkpoint (weights, optimizer, RNG)
  zero2-bf16  one iteration on ZeRO-2 in bf16
  sft         a few SFT steps on solver demos, saved as a loadable checkpoint

Needs only PyTorch, transformers, peft, pandas/pyarrow and what `make gpu-bundle` packs into .gpu/ (DeepSpeed and the
small pure wheels, the bundled tokenizer): the vLLM wheel and the SmolLM2 file are too large to travel to a GPU
machine without network. On a machine without CUDA it refuses unless --allow-cpu (the suite runs it that way).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout, also when it travels as source without an install

import torch  # noqa: E402

# What the GPU machine's image lacks (its package list: PyTorch, transformers, peft, pandas, pyarrow, ...) and
# `make gpu-bundle` carries as wheels, at the versions installed here.
BUNDLED = ("deepspeed", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "hjson", "gymnasium",
           "farama-notifications", "typing-extensions")  # pydantic needs typing-extensions >= 4.16: the image may not
# Carried for scripts/gpu_control.py only: transformers reads the SmolLM2 GGUF file with it (pure Python; its own
# needs, numpy, pyyaml, requests and tqdm, are in the image).
CONTROL_BUNDLED = ("gguf",)
# The GPU machine's Python (wheels with compiled parts must match it).
TARGET_PYTHON = "3.12"
CALL_MIB = 64  # what one device call carries: the working tree plus the carried folders
MODEL_PART_2 = ROOT / ".gpu-model" / "part-2"
PART_2_BYTES = 52 * 2**20  # the rest of the GGUF file goes with .gpu (part 1)

ZERO = {0: {"stage": 0}, 2: {"stage": 2, "overlap_comm": True, "contiguous_gradients": True}}


def ds_config(folder: Path, stage: int) -> Path:
    """A DeepSpeed config of the shipped shape in bf16 (infra/deepspeed's zero0.json computes in fp32)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"zero{stage}-bf16.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                                "gradient_clipping": 1.0, "zero_optimization": ZERO[stage],
                                "bf16": {"enabled": True}}))
    return path


def loop_config(run_dir: Path, ds: Path, steps: int) -> Any:
    from ragen.config import load_config
    from ragen.models import TINY_MODEL

    return load_config(None, ["cpu-small"], [
        f"model.base={TINY_MODEL}", "model.dtype=bf16", "model.warm_start=off", "rollout.engine=hf",
        "envs.train.tags=[SimpleSokoban]", "envs.train.n_groups=[2]", "envs.train.group_size=4",
        "envs.val.tags=[SimpleSokoban]", "envs.val.n_groups=[4]", "envs.val.group_size=1", "agent.max_turn=2",
        "rollout.response_length=12", "algorithm.filter_ratio=1.0", "algorithm.zero_variance_groups=keep",
        "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4", "actor.lr=1e-4", "critic.lr=1e-4",
        f"actor.deepspeed_config={ds}", f"critic.deepspeed_config={ds}", "guard.enabled=false",
        "trainer.test_freq=1", "trainer.checkpoint_every=1", f"trainer.run_dir={run_dir}",
        f"trainer.total_training_steps={steps}"])


def finite(metrics: dict[str, float], keys: tuple[str, ...]) -> dict[str, float]:
    missing = [k for k in keys if k not in metrics]
    if missing:
        raise AssertionError(f"metrics lack {missing}")
    bad = {k: metrics[k] for k in keys if not math.isfinite(metrics[k])}
    if bad:
        raise AssertionError(f"non-finite metrics {bad}")
    return {k: metrics[k] for k in keys}


LOOP_KEYS = ("actor/pg_loss", "critic/vf_loss", "train/SimpleSokoban/score", "val/score", "sync/gate_mean_abs",
             "sync/gate_mean_tol")


def check_loop(work: Path, stage: int, steps: int, name: str, expect: list[int]) -> dict[str, Any]:
    from ragen.run.loop import run_training

    res = run_training(loop_config(work / "runs", ds_config(work, stage), steps), name)
    if res.iterations != expect:
        raise AssertionError(f"completed iterations {res.iterations}, expected {expect}")
    last = res.metrics[expect[-1]]
    if last["sync/gate_mean_abs"] > last["sync/gate_mean_tol"]:
        raise AssertionError(f"sync gate over its tolerance: {last['sync/gate_mean_abs']} > "
                             f"{last['sync/gate_mean_tol']}")
    if not res.run.state(expect[-1]).is_dir():
        raise AssertionError(f"no checkpoint of iteration {expect[-1]}")
    return {"resumed_at": res.resumed_at, "iterations": res.iterations, **finite(last, LOOP_KEYS)}


def check_sft(work: Path) -> dict[str, Any]:
    from ragen.config import load_config
    from ragen.models import TINY_MODEL
    from ragen.sft import pipeline

    cfg = load_config(None, ["cpu-small"], [
        f"model.base={TINY_MODEL}", "sft.tags=[Bandit,SimpleSokoban]", "sft.n_train=6", "sft.n_test=2",
        "sft.mini_batch_size=3", "sft.lr=3e-3", "sft.compute_dtype=bf16", "sft.max_actions_per_turn=3",
        f"sft.deepspeed_config={ds_config(work, 0)}", f"sft.demos={work / 'demos.parquet'}",
        f"sft.output={work / 'sft'}"])
    path, m = pipeline.train_stage(cfg, pipeline.make_demos_stage(cfg))
    if not (path / "checkpoint-complete").is_file():
        raise AssertionError(f"{path} has no checkpoint-complete marker")
    return finite(m, ("sft/steps", "sft/train_loss_first", "sft/train_loss_last", "sft/test_loss"))


def run_step(name: str, fn: Callable[[], dict[str, Any]], cuda: bool, tool: str = "gpu-check") -> dict[str, Any]:
    """One step timed, with its peak GPU memory; an exception is reported in the step (error and traceback)."""
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        out: dict[str, Any] = {"step": name, "ok": True, **fn()}
    except Exception as e:  # reported per step; the next steps still run
        out = {"step": name, "ok": False, "error": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc().splitlines()[-12:]}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None
    print(f"{tool} {name}: {'pass' if out['ok'] else 'FAIL'} in {out['seconds']} s", file=sys.stderr, flush=True)
    return out


def refused_without_cuda(tool: str, allow_cpu: bool, on_cpu: str) -> bool:
    """Whether ``tool`` stops here: no CUDA and no --allow-cpu (said on stderr, with what ``on_cpu`` runs)."""
    if torch.cuda.is_available() or allow_cpu:
        return False
    print(f"{tool}: CUDA is not available here (torch.cuda.is_available() is False); run it on a GPU machine, or "
          f"pass --allow-cpu {on_cpu}", file=sys.stderr)
    return True


def emit(report: dict[str, Any], out: Path | None) -> int:
    """Print the report as one JSON object (also written to ``out``); the exit code: 0 when it passed."""
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return 0 if report["ok"] else 1


def bundle(dest: Path) -> None:
    """Pack what a GPU machine without network needs beside its own image, in two loads of at most ``CALL_MIB``
    with the working tree: ``dest`` (``.gpu/``: the wheels of BUNDLED and CONTROL_BUNDLED, DeepSpeed built from
    its source distribution and the rest downloaded for the target Python, the bundled model's tokenizer, from
    which the tiny model is built there, and part 1 of the SmolLM2 GGUF file) and ``.gpu-model/`` (part 2)."""
    import shutil
    import subprocess
    from importlib.metadata import version

    from gpu_control import MANIFEST, split_file

    from ragen.models.registry import DEFAULT_CPU_MODEL, cache_root
    from ragen.models.smollm2 import TOKENIZER_FILES, gguf_path, prepare_tokenizer

    wheels = dest / "wheels"
    for stale in ("wheels", "site", "cache"):  # what a local `make gpu-check` built there would travel too
        shutil.rmtree(dest / stale, ignore_errors=True)
    wheels.mkdir(parents=True)
    pins = [f"{name}=={version(name)}" for name in (*BUNDLED, *CONTROL_BUNDLED)]
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), pins[0]], check=True)  # source only on PyPI
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", TARGET_PYTHON,
                    "--implementation", "cp", *[a for n in (17, 28) for a in ("--platform", f"manylinux_2_{n}_x86_64")],
                    "-d", str(wheels), *pins[1:]], check=True)
    tok = dest / "cache" / "models" / DEFAULT_CPU_MODEL
    tok.mkdir(parents=True, exist_ok=True)
    src = prepare_tokenizer(cache_root() / "models" / DEFAULT_CPU_MODEL)
    for f in (*TOKENIZER_FILES, "chat_template.jinja"):  # transformers 5 keeps the chat template beside them
        if (src / f).is_file():
            shutil.copy2(src / f, tok / f)
    gguf = gguf_path()
    manifest = dest / MANIFEST.relative_to(ROOT / ".gpu")
    split_file(gguf, [(manifest.with_name("part-1"), gguf.stat().st_size - PART_2_BYTES), (MODEL_PART_2, None)],
               manifest)
    tree = working_tree_bytes()
    loads = {str(dest): tree + folder_bytes(dest),
             MODEL_PART_2.parent.name: tree + folder_bytes(MODEL_PART_2.parent)}
    for folder, size in loads.items():
        print(f"gpu-bundle: a call carrying {folder} moves {size / 2**20:.1f} MiB with the working tree",
              file=sys.stderr)
    over = {f: s for f, s in loads.items() if s > CALL_MIB * 2**20}
    if over:
        raise SystemExit(f"gpu-bundle: over the {CALL_MIB} MiB a call carries: {over}; make the working tree "
                         f"smaller or move bytes between the two parts (PART_2_BYTES)")


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def working_tree_bytes() -> int:
    """What a device call sends besides the carried folders: tracked files and untracked ones git does not
    ignore (where this checkout is not a git repository: nothing known, 0)."""
    import subprocess

    r = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                       capture_output=True)
    if r.returncode != 0:
        return 0
    return sum((ROOT / n).stat().st_size for n in r.stdout.decode().split("\0") if n and (ROOT / n).is_file())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--work", type=Path, help="scratch folder (default: a temporary one, removed after)")
    p.add_argument("--allow-cpu", action="store_true", help="run on the CPU where CUDA is absent (the suite does)")
    p.add_argument("--bundle", type=Path, metavar="DIR", help="instead of checking: pack the wheels and tokenizer "
                   "a GPU machine without network needs into DIR (`make gpu-bundle`: .gpu/)")
    args = p.parse_args(argv)
    if args.bundle:
        bundle(args.bundle)
        return 0

    if refused_without_cuda("gpu-check", args.allow_cpu, "to exercise the same steps on the CPU"):
        return 2
    cuda = torch.cuda.is_available()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ragen-gpu-check-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        steps = [run_step("zero0-bf16", lambda: check_loop(work / "z0", 0, 2, "check", [0, 1]), cuda),
                 run_step("resume", lambda: check_loop(work / "z0", 0, 3, "check", [2]), cuda),
                 run_step("zero2-bf16", lambda: check_loop(work / "z2", 2, 1, "check", [0]), cuda),
                 run_step("sft", lambda: check_sft(work / "sft"), cuda)]
    report = {"ok": all(s["ok"] for s in steps), "device": torch.cuda.get_device_name() if cuda else "cpu",
              "torch": torch.__version__, "cuda": torch.version.cuda, "seconds": round(time.perf_counter() - t0, 1),
              "steps": steps,
              "imported": sorted({m.split(".")[0] for m in sys.modules if not m.startswith("_")}
                                 - set(sys.stdlib_module_names))}
    return emit(report, args.out)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
