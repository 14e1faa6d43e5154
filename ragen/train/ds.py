"""DeepSpeed engines for the actor and critic from a JSON config in ``infra/deepspeed/``, identical on this
CPU machine (DS_ACCELERATOR=cpu, gloo) and on GPUs (nccl).

Gradient accumulation is ours: micro-batches vary in size (token budget), each micro-batch loss already carries
the mini-batch's denominator, so ``backward`` does not rescale and the accumulation boundary is set by hand on
the last micro-batch of a mini-batch."""

from __future__ import annotations

import json
import os
import pickle
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_distributed() -> tuple[int, int]:
    """Initialise torch.distributed once (a launcher's env, or a 1-process group over an in-memory store, which
    opens no port); reuse a group that already exists (in-process vLLM creates one). Returns (rank, world size)."""
    import torch.distributed as dist

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        alone = int(os.environ["WORLD_SIZE"]) == 1
        loopback_gloo(alone)
        if alone:  # an in-memory store instead of a TCP one on every interface
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        import deepspeed

        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)  # the group above, or env://
    else:  # e.g. created by in-process vLLM: DeepSpeed still reads the launcher variables
        os.environ.setdefault("RANK", str(dist.get_rank()))
        os.environ.setdefault("WORLD_SIZE", str(dist.get_world_size()))
        os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))
    _forget_stale_deepspeed_groups()
    return dist.get_rank(), dist.get_world_size()


def loopback_gloo(alone: bool) -> None:
    """One process, or a launch whose ranks meet on this machine (MASTER_ADDR is a loopback address): gloo's own
    sockets listen on the loopback interface, not wherever the host name resolves. A launch over several machines
    keeps gloo's choice (or the user's GLOO_SOCKET_IFNAME)."""
    import ipaddress

    addr = os.environ.get("MASTER_ADDR", "")
    try:
        local = alone or addr == "localhost" or ipaddress.ip_address(addr).is_loopback
    except ValueError:
        local = False
    names = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    if local and names and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = names[0]


def collective_device() -> torch.device:
    """Where a tensor handed to a collective must live: the rank's GPU under NCCL (it refuses CPU tensors),
    the CPU under gloo."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_seen_world: list[Any] = []


def _forget_stale_deepspeed_groups() -> None:
    """DeepSpeed caches a clone of the world group; when a closed in-process vLLM engine took the default group
    with it and a new one was made (a second run in one process), that clone is dead: drop it."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    world = dist.distributed_c10d._get_default_group()
    if _seen_world and _seen_world[0] is not world:
        groups._WORLD_GROUP = None
    _seen_world[:] = [world]


def load_ds_config(path: str | Path, *, grad_clip: float, dtype: str | None = None) -> dict[str, Any]:
    p = Path(path)
    shipped = Path(__file__).resolve().parents[2] / p  # the checkout's infra/deepspeed/*.json, from any directory
    if not p.is_file() and not p.is_absolute() and shipped.is_file():
        p = shipped
    if not p.is_file():
        raise FileNotFoundError(f"DeepSpeed config {p} does not exist (actor/critic.deepspeed_config); the project "
                                f"ships infra/deepspeed/zero0.json, zero2.json and zero3.json")
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"DeepSpeed config {p} is not valid JSON: {e}") from None
    cfg["train_micro_batch_size_per_gpu"] = 1  # informational: batching is ours
    cfg["gradient_accumulation_steps"] = 1
    cfg["gradient_clipping"] = grad_clip
    cfg["zero_allow_untested_optimizer"] = True  # a plain torch AdamW, identical on CPU and GPU
    if dtype == "fp32":
        cfg["bf16"] = {"enabled": False}
    cfg.setdefault("steps_per_print", 10**9)
    return cfg


def config_precision(path: str | Path) -> tuple[int, bool]:
    """(ZeRO stage, bf16) of a DeepSpeed config file: how an engine built from it keeps its weights and state."""
    ds = load_ds_config(path, grad_clip=1.0)
    return int(ds.get("zero_optimization", {}).get("stage", 0)), bool(ds.get("bf16", {}).get("enabled", False))


def param_groups(model: nn.Module, lr: float, lr_of: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """The trainable parameters as AdamW groups: those under a module prefix of ``lr_of`` (e.g. ``value_head``)
    at that rate, the rest at ``lr``. Each group keeps its rate as a multiple of ``lr`` (``lr_scale``), so
    ``set_lr`` moves all of them together."""
    lr_of = dict(lr_of or {})
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = []
    for prefix, rate in lr_of.items():
        ps = [p for n, p in named if n == prefix or n.startswith(prefix + ".")]
        if not ps:
            raise ValueError(f"no trainable parameters under {prefix!r} to give their own learning rate")
        groups.append({"params": ps, "lr": rate, "lr_scale": rate / lr})
    taken = {id(p) for g in groups for p in g["params"]}
    rest = [p for _, p in named if id(p) not in taken]
    return [{"params": rest, "lr": lr, "lr_scale": 1.0}, *groups]


def make_ds_engine(model: nn.Module, *, lr: float, betas: tuple[float, float], weight_decay: float, grad_clip: float,
                ds_config: str | Path, dtype: str | None = None, lr_of: Mapping[str, float] | None = None) -> Any:
    """A DeepSpeed engine with AdamW (constant lr; ``lr_of``: module prefixes at their own rate). Precision
    comes from the config file; ``dtype="fp32"`` forces full precision whatever the file says."""
    import deepspeed

    ensure_distributed()
    opt = torch.optim.AdamW(param_groups(model, lr, lr_of), lr=lr, betas=betas, weight_decay=weight_decay,
                            fused=True)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt,
                                      config=load_ds_config(ds_config, grad_clip=grad_clip, dtype=dtype))
    return engine


def set_lr(engine: Any, lr: float) -> None:
    """Set the learning rate of every parameter group (``lr`` times the group's ``lr_scale``), in DeepSpeed's
    optimizer wrapper and the AdamW inside."""
    opt = engine.optimizer
    for o in (opt, getattr(opt, "optimizer", None)):
        for group in getattr(o, "param_groups", None) or []:
            group["lr"] = lr * group.get("lr_scale", 1.0)


def lrs(engine: Any) -> list[float]:
    """The learning rates in effect (one per parameter group of the inner optimizer)."""
    opt = getattr(engine.optimizer, "optimizer", engine.optimizer)
    return [g["lr"] for g in opt.param_groups]


def zero_stage(engine: Any) -> int:
    return int(engine.zero_optimization_stage())


STATE_TAG = "state"


def save_engine_state(engine: Any, path: str | Path) -> None:
    """DeepSpeed's checkpoint of ``engine`` (optimizer and engine state) under ``path``. Below ZeRO-3 the module's
    weights are left out: the checkpoint's model files (actor/, critic/) hold them whole, and a resume loads them
    from there before this state; a second copy was a quarter of every checkpoint (1.1 of 4.3 GB for SmolLM2's
    actor and critic). ``module_state_dict`` is the hook DeepSpeed's pipeline engine overrides for the same."""
    # frozen weights (a LoRA base) are reloaded from the run's start, never saved again (ZeRO-1/2 would otherwise
    # keep a copy of them as "frozen_param_fragments")
    frozen = has_frozen(engine)
    if zero_stage(engine) >= 3:  # partitioned: DeepSpeed's files are the only whole copy of the trained weights
        engine.save_checkpoint(str(path), tag=STATE_TAG, exclude_frozen_parameters=frozen)
        return
    engine.module_state_dict = lambda *args, **kwargs: {}
    try:
        engine.save_checkpoint(str(path), tag=STATE_TAG, exclude_frozen_parameters=frozen)
    finally:
        del engine.module_state_dict


def checkpoint_globals() -> list[Any]:
    """The classes DeepSpeed's own checkpoints pickle beyond tensors and plain containers (the ZeRO optimizer
    states' loss scaler, fragment addresses and stage enum): the only ones a resume may build."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def load_weights_only(path: str | Path, map_location: Any = None) -> Any:
    """``torch.load`` that builds tensors, plain containers and ``checkpoint_globals`` only: a state file pulled
    from a shared DVC remote cannot run code when a run resumes from it (DeepSpeed itself unpickles anything)."""
    with torch.serialization.safe_globals(checkpoint_globals()):
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as e:
            raise pickle.UnpicklingError(
                f"{path} holds objects a checkpoint of this project never has, so it was not loaded (it could run "
                f"code): {str(e).splitlines()[0]}. Restore the checkpoint from a copy you trust (`dvc checkout` / "
                f"`dvc pull` of its .dvc pointer) or resume from an earlier iteration") from None


def has_frozen(engine: Any) -> bool:
    return any(not p.requires_grad for p in engine.module.parameters())


def load_engine_state(engine: Any, path: str | Path) -> bool:
    """The optimizer and engine state ``save_engine_state`` wrote (into an engine whose module already holds the
    checkpoint's weights); False if DeepSpeed found none. Checkpoints that also hold the weights load as well.
    Every file is read by ``load_weights_only``."""
    ce = engine.checkpoint_engine
    ce.load = load_weights_only  # DeepSpeed reads its state files through this one method
    try:
        loaded, _ = engine.load_checkpoint(str(path), tag=STATE_TAG,
                                           load_module_strict=zero_stage(engine) >= 3 and not has_frozen(engine),
                                           load_optimizer_states=True, load_lr_scheduler_states=False)
    finally:
        del ce.load  # back to the engine's own method
    return loaded is not None


def begin_micro_batch(engine: Any) -> None:
    """What ``DeepSpeedEngine.forward`` does before the model runs, for our losses, which call the module itself:
    ZeRO-3 counts micro-steps there, and without the count every backward would overwrite the gradient shards
    instead of adding to them (only the last micro-batch would train)."""
    opt = getattr(engine, "optimizer", None)
    if zero_stage(engine) == 3 and hasattr(opt, "clear_backward_seen_flag"):
        opt.clear_backward_seen_flag()


def full_parameters(engine: Any) -> Any:
    """A context in which ``engine.module``'s parameters are whole on every rank: ZeRO-3 partitions them, so
    exporting weights (vLLM sync, checkpoints) gathers them first; a no-op below stage 3."""
    import contextlib

    if engine is None or zero_stage(engine) < 3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)


def gathered_state(engine: Any) -> dict[str, torch.Tensor] | None:
    """A whole copy of a ZeRO-3 engine's module state (a collective: every rank calls it); None below stage 3,
    where ``engine.module.state_dict()`` is already whole."""
    if engine is None or zero_stage(engine) < 3:
        return None
    with full_parameters(engine):  # copies: the parameters are partitioned again on leaving
        return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def grad_norm_before_step(engine: Any) -> float | None:
    """The pre-clip global L2 norm of the accumulated gradients when they sit on the parameters (ZeRO-0 fp32,
    after the boundary all-reduce); None where the optimizer holds them (ZeRO-1/2/3, bf16)."""
    if zero_stage(engine) == 0 and not engine.bfloat16_enabled():
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
    return None


def grad_norm_after_step(engine: Any) -> float:
    """The norm DeepSpeed's optimizer computed during ``step`` (NaN if it reports none)."""
    n = engine.get_global_grad_norm()
    return float("nan") if n is None else float(n)
