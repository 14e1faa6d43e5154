"""Supervised fine-tuning on demonstrations: next-token cross-entropy on the loss-masked (assistant) tokens only,
with the RL actor's DeepSpeed engine, micro-batching and step logic (ragen.train), full fine-tune or LoRA (PEFT,
merged into the exported weights), and the RL checkpoint layout (actor/ loadable as ``model.base``)."""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import torch

from ragen.config import Config, SFTConfig
from ragen.models import ensure_model, load_tokenizer
from ragen.models.device import device_of
from ragen.models.precision import runs_bf16
from ragen.train.batch import Sequences, sequences_from_rollouts
from ragen.train.checkpoint import write_checkpoint
from ragen.train.ds import collective_device, ensure_distributed, make_ds_engine
from ragen.train.networks import load_actor, token_logprobs, unwrap
from ragen.train.update import boundary_steps, micro_batches

SFT_RECORD = "sft.json"


def masked_nll(model: Any, mb: Any, bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed negative log-likelihood of the loss-masked tokens of a micro-batch, and their count. The output
    layer and softmax run only where masked tokens are predicted (``token_logprobs`` with ``positions``): the
    prompt is most of a demo. ``bf16`` autocasts the matmuls (fp32 weights, optimizer and loss)."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT wraps the causal LM
    mb = mb.to(device_of(lm))
    target = mb.loss_mask.bool() & mb.attention_mask.bool()
    target[:, 0] = False  # the first token is predicted by nothing
    lp, _ = token_logprobs(lm, mb.input_ids, mb.attention_mask, bf16=bf16, positions=target)
    return -(lp * target).sum(), target.sum()


def apply_lora(model: torch.nn.Module, s: SFTConfig) -> torch.nn.Module:
    from peft import get_peft_model

    from ragen.train.lora import LoraSpec

    config = LoraSpec(s.lora_rank, s.lora_alpha, s.lora_target_modules).peft_config()
    config.task_type = "CAUSAL_LM"
    return get_peft_model(model, config)


@dataclass
class SFTResult:
    steps: int
    epochs_done: float
    stopped_by_time: bool
    history: list[dict[str, float]] = field(default_factory=list)  # one record per optimizer step
    metrics: dict[str, float] = field(default_factory=dict)


class SFTTrainer:
    def __init__(self, cfg: Config, *, model_path: str | None = None) -> None:
        self.cfg, s = cfg, cfg.sft
        self.base = model_path or ensure_model(cfg.model.base)
        self.rank, self.world = ensure_distributed()
        m = cfg.model
        self.tokenizer = load_tokenizer(m.base if model_path is None else model_path, m.tokenizer,
                                        m.trust_remote_code)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else \
            self.tokenizer.eos_token_id
        model = load_actor(self.base, trust_remote_code=m.trust_remote_code,
                           gradient_checkpointing=s.gradient_checkpointing)
        if s.lora_rank > 0:
            model = apply_lora(model, s)
        self.engine = make_ds_engine(model, lr=s.lr, betas=(0.9, 0.999), weight_decay=s.weight_decay,
                                  grad_clip=s.grad_clip, ds_config=s.deepspeed_config)
        self.bf16 = runs_bf16(cfg, "sft")
        self.trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    @property
    def lora(self) -> bool:
        return self.cfg.sft.lora_rank > 0

    def _micro(self, seqs: Sequences, idx: list[int]) -> list[Any]:
        return micro_batches(seqs, idx, micro_batch_size=1, token_budget=self.cfg.sft.micro_batch_tokens,
                             pad_id=self.pad_id)

    @torch.no_grad()
    def evaluate_loss(self, demos: pd.DataFrame) -> float:
        """Token-mean NLL of the masked tokens over a demo table (held-out loss)."""
        seqs = sequences_from_rollouts(demos)
        m = unwrap(self.engine)
        was = m.training
        m.eval()
        total, count = 0.0, 0
        for mb in self._micro(seqs, list(range(len(seqs)))[self.rank::self.world]):
            nll, n = masked_nll(m, mb, self.bf16)
            total, count = total + float(nll), count + int(n)
        m.train(was)
        if self.world > 1:
            import torch.distributed as dist

            t = torch.tensor([total, count], dtype=torch.float64, device=collective_device())
            dist.all_reduce(t)
            total, count = float(t[0]), int(t[1])
        return total / max(count, 1)

    def train(self, demos: pd.DataFrame, *, test: pd.DataFrame | None = None,
              on_step: Callable[[dict[str, float]], None] | None = None) -> SFTResult:
        """``sft.epochs`` passes over the demos in a seeded shuffled order (tags mixed), ``sft.mini_batch_size``
        demos per step, until done or ``sft.max_minutes`` have passed (checked at step boundaries)."""
        s = self.cfg.sft
        seqs = sequences_from_rollouts(demos)
        n = len(seqs)
        if n < self.world or s.mini_batch_size < self.world:
            raise ValueError(f"{n} demonstrations, sft.mini_batch_size={s.mini_batch_size} for {self.world} ranks: "
                             f"every rank needs a demo of every step; raise sft.n_train / sft.mini_batch_size")
        opt = SimpleNamespace(micro_batch_size=1, micro_batch_tokens=s.micro_batch_tokens)
        m = unwrap(self.engine)
        m.train()
        t0 = time.monotonic()
        deadline = t0 + s.max_minutes * 60
        res = SFTResult(0, 0.0, False)
        steps_per_epoch = n // s.mini_batch_size if self.world > 1 else math.ceil(n / s.mini_batch_size)
        # (with several ranks a short last mini-batch could leave a rank without a demo: it is dropped)
        for epoch in range(s.epochs):
            order = np.random.default_rng([s.seed, epoch]).permutation(n).tolist()
            for j in range(steps_per_epoch):
                if self._out_of_time(deadline):
                    res.stopped_by_time = True
                    break
                mini = order[j * s.mini_batch_size:(j + 1) * s.mini_batch_size]
                n_tok = float(sum(int(seqs.loss_mask[i].sum()) for i in mini))

                def loss_fn(mb: Any, n_tok: float = n_tok) -> tuple[torch.Tensor, dict[str, float]]:
                    nll, _ = masked_nll(m, mb, self.bf16)
                    loss = nll / n_tok  # the mini-batch's token mean, whatever the micro-batching
                    return loss, {"loss": float(loss.detach())}

                out = boundary_steps(self.engine, seqs, mini[self.rank::self.world], opt, self.pad_id, loss_fn,
                                     self.world)
                res.steps += 1
                rec = {"step": float(res.steps), "epoch": epoch + (j + 1) / steps_per_epoch, "loss": out["loss"],
                       "grad_norm": out["grad_norm"], "skipped": out["skipped"], "tokens": n_tok,
                       "elapsed_s": time.monotonic() - t0}
                res.history.append(rec)
                if on_step is not None:
                    on_step(rec)
            res.epochs_done = epoch + (j + 1) / steps_per_epoch if not res.stopped_by_time else \
                epoch + j / steps_per_epoch
            if res.stopped_by_time:
                break
        losses = [r["loss"] for r in res.history]
        res.metrics = {"sft/steps": float(res.steps), "sft/epochs": res.epochs_done,
                       "sft/train_loss_first": losses[0] if losses else math.nan,
                       "sft/train_loss_last": float(np.mean(losses[-5:])) if losses else math.nan,
                       "sft/time_s": time.monotonic() - t0, "sft/stopped_by_time": float(res.stopped_by_time),
                       "sft/trainable_params": float(self.trainable)}
        if test is not None and len(test):
            res.metrics["sft/test_loss"] = self.evaluate_loss(test)
        return res

    def _out_of_time(self, deadline: float) -> bool:
        """The wall-clock cap, decided together: a rank stopping alone would leave the others in a collective."""
        stop = time.monotonic() >= deadline
        if self.world > 1:
            import torch.distributed as dist

            t = torch.tensor([float(stop)], device=collective_device())
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            stop = bool(t.item() > 0)
        return stop

    # -- export ---------------------------------------------------------------------------------------------
    def export_model(self) -> torch.nn.Module:
        """The plain causal LM with the training applied (LoRA merged into a copy; the engine keeps adapters)."""
        m = unwrap(self.engine)
        if self.lora:
            return copy.deepcopy(m).merge_and_unload()
        return m

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.export_model().state_dict().items())

    def save(self, path: str | Path, record: dict[str, Any]) -> Path:
        """actor/ (merged weights + tokenizer), adapter/ (LoRA only), deepspeed/actor, sft.json, marker last."""
        def files(tmp: Path) -> None:
            model = self.export_model()
            model.config.use_cache = True  # for generation from the saved model; training runs without the cache
            try:
                model.save_pretrained(tmp / "actor", safe_serialization=True)
            finally:
                model.config.use_cache = False
            self.tokenizer.save_pretrained(tmp / "actor")
            if self.lora:
                unwrap(self.engine).save_pretrained(tmp / "adapter")
            (tmp / SFT_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")

        return write_checkpoint(path, rank=self.rank, world=self.world, write_files=files,
                                engines={"actor": self.engine})
