"""GPU memory of the training side per ZeRO stage, computed: the model states of the actor and the critic (weights,
gradients, Adam moments, fp32 master weights) as the ZeRO paper counts them (Rajbhandari et al. 2020, sec. 3.1),
plus the frozen reference model when a KL term needs it. Activations, vLLM's share of the GPU
(``rollout.gpu_memory_utilization``) and framework buffers come on top; the table says so.

Bytes per parameter, mixed precision (bf16 weights and gradients, fp32 master copy + Adam m, v = 12): 16 in all;
full fp32 (weights, gradients, Adam m, v): 16 as well, split 4 + 4 + 8. ZeRO-1 shards the optimizer part over the
N data-parallel ranks, ZeRO-2 also the gradients, ZeRO-3 also the weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024**3

# config.json of the paper's model family (Qwen2.5-*-Instruct), enough to count parameters on the meta device
QWEN25 = {
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True},
    "qwen2.5-1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True},
    "qwen2.5-3b": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                   "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
                   "tie_word_embeddings": True},
    "qwen2.5-7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "tie_word_embeddings": False},
}


def meta_model(model: str) -> Any:
    """A causal LM built on the meta device (no weights read or allocated): a name of ``QWEN25`` or a local model
    directory (its config.json)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    if model in QWEN25:
        cfg = Qwen2Config(**QWEN25[model])
    else:
        from ragen.train.checkpoint import model_dir

        path = model_dir(model)
        if path is None:
            raise FileNotFoundError(f"{model!r} is neither one of {', '.join(QWEN25)} nor a local model directory "
                                    f"with config.json")
        cfg = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def count_parameters(model: str) -> int:
    """Parameters of a causal LM (``meta_model``); tied input/output embeddings are one tensor, counted once."""
    m = meta_model(model)
    return sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())


def count_saved_parameters(folder: str) -> int | None:
    """Parameters of a local model from its safetensors headers alone (no torch, no transformers: fast at a run's
    start), or None where it has none. A tied output layer is saved once, so counted once, as in
    ``count_parameters``."""
    import json
    import math
    import struct
    from pathlib import Path

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total


def count_lora_parameters(model: str, model_cfg: Any) -> int:
    """Parameters of the adapters ``model.lora_rank`` / ``lora_target_modules`` add to ``model``."""
    from ragen.train.lora import add_adapters, lora_spec

    spec = lora_spec(model_cfg)
    if spec is None:
        return 0
    m = add_adapters(meta_model(model), spec)
    return sum(p.numel() for n, p in m.named_parameters() if "lora_" in n)


def model_state_bytes(n_params: int, stage: int, world: int, *, mixed: bool = True) -> float:
    """Bytes of one rank's model states for ``n_params`` trainable parameters at ZeRO ``stage`` over ``world``
    data-parallel ranks."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0-3, got {stage}")
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    w, g, o = (2, 2, 12) if mixed else (4, 4, 8)
    per_param = {0: w + g + o, 1: w + g + o / world, 2: w + (g + o) / world, 3: (w + g + o) / world}[stage]
    return n_params * per_param


@dataclass(frozen=True)
class MemoryRow:
    stage: int
    world: int
    actor_gib: float
    critic_gib: float
    reference_gib: float

    @property
    def total_gib(self) -> float:
        return self.actor_gib + self.critic_gib + self.reference_gib


def memory_table(n_params: int, *, worlds: tuple[int, ...] = (1, 2, 4, 8), mixed: bool = True, critic: bool = True,
                 reference: bool = False) -> list[MemoryRow]:
    """Per-rank GiB by stage and world size: actor + critic (a backbone of the same size; its value head is
    negligible) + the bf16 reference model (sharded only by ZeRO-3)."""
    rows = []
    for stage in (0, 1, 2, 3):
        for world in worlds:
            a = model_state_bytes(n_params, stage, world, mixed=mixed) / GIB
            ref = (2 * n_params / (world if stage == 3 else 1)) / GIB if reference else 0.0
            rows.append(MemoryRow(stage, world, a, a if critic else 0.0, ref))
    return rows


def memory_report(model: str, *, worlds: tuple[int, ...] = (1, 2, 4, 8), mixed: bool = True, critic: bool = True,
                  reference: bool = False) -> dict[str, Any]:
    n = count_parameters(model)
    rows = memory_table(n, worlds=worlds, mixed=mixed, critic=critic, reference=reference)
    return {"model": model, "parameters": n, "precision": "bf16 mixed (fp32 master + Adam)" if mixed else "fp32",
            "critic": critic, "reference": reference,
            "rows": [{"zero_stage": r.stage, "gpus": r.world, "actor_gib": round(r.actor_gib, 2),
                      "critic_gib": round(r.critic_gib, 2), "reference_gib": round(r.reference_gib, 2),
                      "total_gib": round(r.total_gib, 2)} for r in rows],
            "excludes": "activations (grow with micro-batch tokens; gradient checkpointing cuts them), the vLLM "
                        "engine's rollout.gpu_memory_utilization share, CUDA/NCCL buffers"}


def markdown(report: dict[str, Any]) -> str:
    worlds = sorted({r["gpus"] for r in report["rows"]})
    head = "| ZeRO stage | " + " | ".join(f"{w} GPU{'s' if w > 1 else ''}" for w in worlds) + " |"
    lines = [f"{report['model']}: {report['parameters'] / 1e9:.2f}B parameters, {report['precision']}, "
             f"GiB per GPU for actor{' + critic' if report['critic'] else ''}"
             f"{' + reference' if report['reference'] else ''} model states", "", head,
             "|" + "---|" * (len(worlds) + 1)]
    for stage in (0, 1, 2, 3):
        cells = [f"{r['total_gib']:.1f}" for r in report["rows"] if r["zero_stage"] == stage]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def countable(base: str) -> str:
    """What ``meta_model`` builds for ``model.base``: its local folder (a packaged alias's is in the model
    cache), else its ``QWEN25`` name (a hub id of that family), else ``base`` unchanged."""
    from pathlib import Path

    from ragen.models import resolve_model_path

    path = resolve_model_path(base)
    return path if (Path(path) / "config.json").is_file() else model_alias(base)


def model_alias(base: str) -> str:
    """The ``QWEN25`` name of a hub id such as ``Qwen/Qwen2.5-0.5B-Instruct``, else ``base`` unchanged."""
    low = base.lower().rsplit("/", 1)[-1]
    return next((name for name in QWEN25 if low.startswith(name)), base)


def colocated_budget(n_params: int, *, gpu_gib: float, gpu_memory_utilization: float,
                     kv_cache_gib: float | None, sleep_during_update: bool, stage: int, world: int = 1,
                     critic: bool = True, reference: bool = False, mixed: bool = True,
                     engine_bytes_per_param: int = 2) -> dict[str, float]:
    """One GPU shared by vLLM and DeepSpeed, per phase (GiB). The trainer's model states stay on the GPU all run.
    vLLM holds ``gpu_memory_utilization`` x the GPU (weights and KV cache inside it), or its weights plus
    ``kv_cache_gib`` when that is set. During the update a sleeping engine (level 1: weights to CPU memory, KV
    cache freed) holds nothing; an awake one keeps its share. What is left in each phase is for activations,
    the allocator's cache and CUDA/NCCL buffers."""
    row = next(r for r in memory_table(n_params, worlds=(world,), mixed=mixed, critic=critic, reference=reference)
               if r.stage == stage)
    weights = engine_bytes_per_param * n_params / GIB
    engine = weights + kv_cache_gib if kv_cache_gib is not None else gpu_memory_utilization * gpu_gib
    during_update = 0.0 if sleep_during_update else engine
    out = {"gpu_gib": gpu_gib, "trainer_states_gib": row.total_gib, "engine_weights_gib": weights,
           "engine_gib": engine, "engine_during_update_gib": during_update,
           "rollout_phase_gib": row.total_gib + engine, "update_phase_gib": row.total_gib + during_update}
    out["rollout_headroom_gib"] = gpu_gib - out["rollout_phase_gib"]
    out["update_headroom_gib"] = gpu_gib - out["update_phase_gib"]
    return {k: round(v, 2) for k, v in out.items()}


def config_budget(cfg: Any, *, gpu_gib: float = 80.0, world: int = 1) -> dict[str, Any]:
    """``colocated_budget`` for a resolved config: its model, vLLM memory settings, whether it needs a critic or a
    reference model, and the actor's ZeRO stage (its DeepSpeed config)."""
    from ragen.algos.advantages import needs_critic
    from ragen.train.ds import config_precision

    model = countable(cfg.model.base)
    stage = config_precision(cfg.actor.deepspeed_config)[0]
    a, r = cfg.algorithm, cfg.rollout
    reference = bool(a.use_kl_in_reward or cfg.actor.use_kl_loss or a.kl_monitor)
    n = count_parameters(model)
    mixed = cfg.actor.compute_dtype == "bf16"
    budget = colocated_budget(n, gpu_gib=gpu_gib, gpu_memory_utilization=r.gpu_memory_utilization,
                              kv_cache_gib=r.kv_cache_memory_gib, sleep_during_update=r.sleep_during_update,
                              stage=stage, world=world, critic=needs_critic(a.adv_estimator), reference=reference,
                              mixed=mixed)
    return {"model": model, "parameters": n, "zero_stage": stage, "gpus": world,
            "critic": needs_critic(a.adv_estimator), "reference": reference,
            "gpu_memory_utilization": r.gpu_memory_utilization, "kv_cache_memory_gib": r.kv_cache_memory_gib,
            "sleep_during_update": r.sleep_during_update, **budget}
