"""Disk a run's checkpoints take, computed from the config: the bytes of one checkpoint (the actor's model files,
and the resume state: the critic, DeepSpeed's optimizer and engine state), how many the retention rule keeps at
once (ragen/run/retention.py; every iteration writes one, the resume point, beside the one before it), and the
peak of the run directory. A run refuses to start where the disk cannot hold that peak (``check_disk``).

Each engine's DeepSpeed config decides its precision (``engine_files``): under bf16 its weights take 2 bytes and its
state 12 bytes per trained parameter (an fp32 master copy and Adam's two moments), else 4 and 8 (the moments);
ZeRO-3 also saves the module's weights in that state (below ZeRO-3 the checkpoint's model files are the only copy).
Iteration data (rollouts, metrics) is small beside it and left out."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ragen.run.retention import retained_states

GB = 1e9


@dataclass(frozen=True)
class DiskPlan:
    model_files: float  # bytes of a checkpoint's actor/ (or adapters/actor)
    resume_state: float  # bytes of its critic and DeepSpeed state
    iterations: int
    checkpoint_every: int
    resume_state_kept: str  # trainer.resume_state
    kept_at_peak: int  # checkpoints on disk at the peak: the kept ones, the latest and the one being written
    peak: float  # bytes of checkpoints at the peak

    @property
    def checkpoint(self) -> float:
        return self.model_files + self.resume_state

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "checkpoint": self.checkpoint}


def engine_files(opt: Any, n_params: int, lora_params: int) -> tuple[float, float]:
    """(model files, DeepSpeed state) in bytes of one engine (``actor`` or ``critic`` settings): under bf16 the
    module is kept in bf16 (2 bytes a weight) with an fp32 master copy and Adam's moments (12 bytes a trained
    parameter), else in fp32 (4) with the moments (8); ZeRO-3 saves the module in DeepSpeed's state too. LoRA
    adapters are written in fp32."""
    from ragen.train.ds import config_precision

    stage, bf16 = config_precision(opt.deepspeed_config)
    weight = 2 if bf16 else 4
    trained = lora_params or n_params
    files = trained * (4 if lora_params else weight)
    state = trained * (12 if bf16 else 8) + (n_params * weight if stage >= 3 else 0)
    return float(files), float(state)


def checkpoint_parts(cfg: Any, n_params: int, lora_params: int = 0) -> tuple[float, float]:
    """(model files, resume state) in bytes of one checkpoint of ``cfg``'s run: ``n_params`` in the model,
    ``lora_params`` in its adapters when ``model.lora_rank`` > 0 (the critic's backbone takes the same)."""
    from ragen.algos.advantages import needs_critic

    lora = lora_params if cfg.model.lora_rank > 0 else 0
    model_files, resume = engine_files(cfg.actor, n_params, lora)
    if needs_critic(cfg.algorithm.adv_estimator):
        critic_files, critic_state = engine_files(cfg.critic, n_params, lora)
        resume += critic_files + critic_state
    return model_files, resume


def disk_plan(cfg: Any, n_params: int, lora_params: int = 0) -> DiskPlan:
    """The run directory's checkpoints over ``cfg``'s whole run, at their peak: while iteration k's checkpoint is
    written, the ones kept after k-1 (the latest whole; under trainer.resume_state=latest the others without
    their resume state) and a best one distinct from them all (the worst case)."""
    model_files, resume = checkpoint_parts(cfg, n_params, lora_params)
    n, every = cfg.trainer.total_training_steps, cfg.trainer.checkpoint_every
    stripped = cfg.trainer.resume_state == "latest"
    peak, kept_at_peak = 0.0, 0
    for k in range(n):
        done = list(range(k))
        kept = retained_states(done, every, best=None)
        others = len(kept - {k - 1}) + (1 if len(kept) < len(done) else 0)  # + a best among the dropped ones
        whole = (1 if k >= 1 else 0) + 1  # the latest, and k's being written
        on_disk = whole * (model_files + resume) + others * (model_files + (0 if stripped else resume))
        if on_disk > peak:
            peak, kept_at_peak = on_disk, whole + others
    return DiskPlan(model_files, resume, n, every, cfg.trainer.resume_state, kept_at_peak, peak)


def lora_parameters(cfg: Any, model: str) -> int:
    """Parameters of the adapters ``model.lora_rank`` adds to ``model`` (0 for a full fine-tune)."""
    from ragen.train.memory import count_lora_parameters

    return count_lora_parameters(model, cfg.model) if cfg.model.lora_rank > 0 else 0


def count_model(cfg: Any) -> tuple[int, int] | None:
    """(parameters, LoRA adapter parameters) of ``model.base``: a local model from its safetensors headers, a
    Qwen2.5 size on the meta device; None when its config cannot be read here (a hub id that is not one of the
    Qwen2.5 sizes and not downloaded, a packaged model not built yet)."""
    from ragen.train.memory import QWEN25, count_parameters, count_saved_parameters, countable

    model = countable(cfg.model.base)
    if model not in QWEN25 and not (Path(model) / "config.json").is_file():
        return None
    saved = count_saved_parameters(model) if model not in QWEN25 else None
    return (saved if saved is not None else count_parameters(model)), lora_parameters(cfg, model)


class DiskTooSmall(RuntimeError):
    pass


def check_disk(cfg: Any, run_dir: str | Path) -> DiskPlan | None:
    """Refuse a run whose checkpoints cannot fit the free space of the disk under ``run_dir`` plus what the run's
    own checkpoints hold already (a resumed run replaces them), naming the numbers and the settings that shrink
    them. None when the model cannot be counted here."""
    from ragen.run.rundir import CHECKPOINTS

    counted = count_model(cfg)
    if counted is None:
        return None
    plan = disk_plan(cfg, *counted)
    where = Path(run_dir).resolve()
    probe = where
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    held = sum(f.stat().st_size for f in (where / CHECKPOINTS).rglob("*") if f.is_file() and not f.is_symlink())
    if plan.peak > free + held:
        raise DiskTooSmall(
            f"the run's checkpoints need {plan.peak / GB:.1f} GB at their peak ({plan.kept_at_peak} checkpoints of "
            f"{plan.checkpoint / GB:.2f} GB, {plan.resume_state / GB:.2f} GB of it resume state) but {probe} has "
            f"{free / GB:.1f} GB free" + (f" and the run's checkpoints hold {held / GB:.1f} GB" if held else "") +
            "; keep fewer (trainer.checkpoint_every higher), the resume state with the latest only "
            "(trainer.resume_state=latest), or point trainer.run_dir at a larger disk (`ragen bench memory "
            "--preset ...` prints the plan)")
    return plan
