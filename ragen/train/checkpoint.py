"""Checkpoint directories shared by RL and SFT: model files written by rank 0, DeepSpeed engine states by every
rank, all into ``<path>.partial`` renamed into place with a completion marker last, so a crash never leaves a
checkpoint that looks complete. ``actor/`` is always a plain model directory (safetensors + tokenizer) that vLLM,
transformers and ``model.base`` load."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ragen.io import fsync_path, sync_tree, write_text_atomic

COMPLETE = "checkpoint-complete"  # also ragen.run.rundir.STATE_MARKER (kept light: no torch import there)


def is_complete(path: str | Path) -> bool:
    return (Path(path) / COMPLETE).is_file()


def model_dir(path: str | Path) -> Path | None:
    """The loadable model inside a checkpoint (``path/actor``; a LoRA checkpoint's merged model, written once
    into the cache) or ``path`` itself if it is one; else None."""
    from ragen.train.lora import adapter_checkpoint, materialize

    p = Path(path)
    for d in (p / "actor", p):
        if (d / "config.json").is_file():
            return d
    if is_complete(p) and adapter_checkpoint(p) is not None:
        return materialize(p)
    return None


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def write_checkpoint(path: str | Path, *, rank: int, world: int, write_files: Callable[[Path], None],
                     engines: Mapping[str, Any]) -> Path:
    """``write_files(tmp)`` writes the model files (rank 0 only); each engine saves its optimizer and engine
    state under ``deepspeed/<name>`` (``ragen.train.ds.save_engine_state``)."""
    from ragen.train.ds import save_engine_state

    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write_files(tmp)
    _barrier(world)
    for name, engine in engines.items():
        if engine is not None:
            save_engine_state(engine, tmp / "deepspeed" / name)
    _barrier(world)
    if rank == 0:
        sync_tree(tmp)  # every file on the disk before the marker says so (a power cut keeps a complete checkpoint)
        write_text_atomic(tmp / COMPLETE, f"{time.time()}\n")
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
        fsync_path(path.parent)
    _barrier(world)
    return path
