"""LoRA adapters for the RL actor and critic (``model.lora_rank > 0``).

PEFT's LoRA layers are injected into the model in place, so the module keeps its class and every forward pass of
the trainer (log-probs, values, the sync gate's probe) runs unchanged; every other weight is frozen (no gradient,
no optimizer state). The rollout engine, evaluations and exports get merged weights W + (alpha / r) B A under the
plain model's names; a checkpoint holds the adapters only (``adapters/actor``, ``adapters/critic`` with the value
head), and ``materialize`` writes the merged model directory a checkpoint stands for, once, into the cache."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

ADAPTERS = "adapters"  # the checkpoint folder holding adapters/actor and adapters/critic
ADAPTER_FILE = "adapter.safetensors"
ADAPTER_JSON = "adapter.json"
INIT_SEED = 0  # the A matrices' initialisation does not depend on (or advance) the caller's RNG
MERGED_KEPT = 4  # merged models kept in the cache (a model's size each), the most recently used
_LORA_KEY = re.compile(r"^(?P<prefix>.+)\.lora_(?P<which>[AB])\.default\.weight$")


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: int
    targets: str  # 'all-linear' or comma-separated module names

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "targets": self.targets}

    def peft_config(self) -> Any:
        from peft import LoraConfig

        target: str | list[str] = self.targets
        if target != "all-linear":
            target = [t.strip() for t in target.split(",") if t.strip()]
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=0.0, target_modules=target, bias="none")


def lora_spec(model_cfg: Any) -> LoraSpec | None:
    """The adapters ``model.lora_rank`` / ``lora_alpha`` / ``lora_target_modules`` ask for; None = full fine-tune."""
    if model_cfg.lora_rank <= 0:
        return None
    return LoraSpec(model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.lora_target_modules)


def add_adapters(module: nn.Module, spec: LoraSpec) -> nn.Module:
    """Inject LoRA layers into ``module`` in place and freeze everything else; B starts at 0, so the adapted model
    computes exactly what the base model does until the first step."""
    from peft import inject_adapter_in_model

    module.requires_grad_(False)
    unmatched = ValueError(f"model.lora_target_modules={spec.targets!r} matches no module of "
                           f"{type(module).__name__}; use 'all-linear' or names such as q_proj,v_proj")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        try:
            inject_adapter_in_model(spec.peft_config(), module)
        except ValueError as e:
            if "not found in the base model" in str(e):
                raise unmatched from None
            raise
    if not any(".lora_" in n for n, _ in module.named_parameters()):
        raise unmatched
    for n, p in module.named_parameters():
        p.requires_grad_(".lora_" in n)
    return module


def adapter_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if _LORA_KEY.match(k)}


def merge_adapters(plain: Mapping[str, torch.Tensor], adapters: Mapping[str, torch.Tensor],
                   scaling: float) -> dict[str, torch.Tensor]:
    """``plain`` (a state dict under the plain model's names) with each adapted weight replaced by
    W + scaling * B @ A, computed in fp32 and stored in W's dtype. ``adapters``: ``<module>.lora_A.default.weight``
    (r, in) and ``<module>.lora_B.default.weight`` (out, r) per adapted module."""
    out = dict(plain)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in adapters.items():
        m = _LORA_KEY.match(k)
        if m is None:
            raise ValueError(f"{k!r} is not a LoRA adapter weight")
        pairs.setdefault(m["prefix"], {})[m["which"]] = v
    for prefix, ab in pairs.items():
        w = out.get(prefix + ".weight")
        if w is None or set(ab) != {"A", "B"}:
            raise ValueError(f"adapter of {prefix!r} has no weight to merge into, or lacks its A or B matrix")
        delta = ab["B"].float() @ ab["A"].float()
        out[prefix + ".weight"] = (w.float() + scaling * delta).to(w.dtype)
    return out


def merged_state(state: Mapping[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """The state dict of an adapted module as the plain model's: base weights renamed back (``.base_layer.``
    dropped) with the adapters merged into them."""
    plain = {k.replace(".base_layer.", "."): v for k, v in state.items() if not _LORA_KEY.match(k)}
    return merge_adapters(plain, adapter_state(state), scaling)


def save_adapters(folder: Path, state: Mapping[str, torch.Tensor], spec: LoraSpec, base: str) -> None:
    """The adapters of ``state`` (fp32, as trained) and what they adapt: the spec and the base model path."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in adapter_state(state).items()}, str(folder / ADAPTER_FILE))
    if Path(base).exists():  # a local model (the SFT warm-start): found again from any working directory
        base = str(Path(base).resolve())
    (folder / ADAPTER_JSON).write_text(json.dumps({**spec.as_dict(), "base": base}, indent=2, sort_keys=True) + "\n")


def read_spec(folder: Path) -> tuple[LoraSpec, str]:
    meta = json.loads((folder / ADAPTER_JSON).read_text())
    return LoraSpec(int(meta["rank"]), int(meta["alpha"]), str(meta["targets"])), str(meta["base"])


def load_adapters(module: nn.Module, folder: Path, spec: LoraSpec) -> None:
    """Load saved adapters into a module ``add_adapters`` prepared with ``spec``; refuses other adapter settings
    and a file that misses or adds adapter weights."""
    from safetensors.torch import load_file

    if not (folder / ADAPTER_FILE).is_file() or not (folder / ADAPTER_JSON).is_file():
        raise FileNotFoundError(f"{folder} holds no LoRA adapters ({ADAPTER_FILE} and {ADAPTER_JSON})")
    saved, _ = read_spec(folder)
    if saved != spec:
        diff = ", ".join(f"{k} {a!r} (checkpoint) vs {b!r} (config)" for (k, a), b in
                         zip(saved.as_dict().items(), spec.as_dict().values(), strict=True) if a != b)
        raise ValueError(f"the adapters in {folder} were trained with other LoRA settings: {diff}; resume with the "
                         f"checkpoint's model.lora_rank / lora_alpha / lora_target_modules")
    tensors = load_file(str(folder / ADAPTER_FILE))
    expected = set(adapter_state(module.state_dict()))
    if set(tensors) != expected:
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise ValueError(f"{folder / ADAPTER_FILE} does not fit the model: missing {missing[:3]}, "
                         f"unexpected {extra[:3]}")
    module.load_state_dict(tensors, strict=False)


def adapter_checkpoint(path: str | Path) -> Path | None:
    """``path/adapters/actor`` when ``path`` is a checkpoint of a LoRA run, else None."""
    d = Path(path) / ADAPTERS / "actor"
    return d if (d / ADAPTER_JSON).is_file() else None


def materialize(checkpoint: str | Path) -> Path:
    """The plain model directory (merged safetensors + tokenizer) that a LoRA checkpoint's actor stands for:
    written once under ``<cache>/merged/<digest of base and adapters>`` and reused, so evaluation, the rollout
    engine of a resumed run and the model registry load it as any model directory."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragen.models import cache_root, ensure_model
    from ragen.models.registry import staged_dir

    folder = adapter_checkpoint(checkpoint)
    if folder is None:
        raise FileNotFoundError(f"{checkpoint} is not a LoRA checkpoint (no {ADAPTERS}/actor/{ADAPTER_JSON})")
    spec, base = read_spec(folder)
    digest = hashlib.sha256(base.encode() + (folder / ADAPTER_FILE).read_bytes() +
                            (folder / ADAPTER_JSON).read_bytes()).hexdigest()[:20]
    target = cache_root() / "merged" / digest
    done = "merged-complete"
    if (target / done).is_file():
        (target / done).touch()  # recently used: kept by the pruning below
        return target
    model = AutoModelForCausalLM.from_pretrained(ensure_model(base), dtype=torch.float32)
    merged = merge_adapters(model.state_dict(), load_file(str(folder / ADAPTER_FILE)), spec.scaling)
    with staged_dir(target, marker=done) as tmp:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=merged)
        AutoTokenizer.from_pretrained(str(folder)).save_pretrained(tmp)
        (tmp / done).write_text(json.dumps({"checkpoint": str(checkpoint), "base": base}) + "\n")
    prune_merged(target.parent, keep=MERGED_KEPT)
    return target


def prune_merged(root: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` most recently used merged models under ``root`` (any is made again from its
    checkpoint on demand); unfinished ones are left to the writer that owns them. Returns what was deleted."""
    import shutil

    done = sorted((d for d in root.iterdir() if (d / "merged-complete").is_file()),
                  key=lambda d: (d / "merged-complete").stat().st_mtime, reverse=True)
    for d in done[keep:]:
        shutil.rmtree(d, ignore_errors=True)
    return done[keep:]
