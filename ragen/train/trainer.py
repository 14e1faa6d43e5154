"""The trainer a run holds for its whole life: actor, critic and reference engines; filtering a rollout batch,
updating on it, exporting weights to the rollout engine (with the sync gate), and checkpoints to resume from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ragen.algos.advantages import needs_critic
from ragen.algos.filtering import filter_groups
from ragen.config import Config, config_to_dict
from ragen.models import ensure_model, load_tokenizer
from ragen.models.precision import model_dtype
from ragen.rollout.engine import Engine
from ragen.rollout.hf_engine import sequence_logprobs
from ragen.rollout.sync import DEFAULT_PROBE, GateReport, calibrate_gate, probe_batch, sync_weights
from ragen.train.batch import sequences_from_rollouts
from ragen.train.checkpoint import COMPLETE, write_checkpoint
from ragen.train.ds import ensure_distributed, gathered_state, load_engine_state, make_ds_engine, set_lr
from ragen.train.lora import ADAPTERS, LoraSpec, add_adapters, load_adapters, lora_spec, merged_state, save_adapters
from ragen.train.networks import load_actor, load_critic, load_reference
from ragen.train.update import UpdateResult, update

VALUE_HEAD = "value_head.safetensors"


def filter_rollouts(cfg: Config, df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
    """Keep whole seed groups by in-group spread of the raw score (docs/algorithms.md; raw, not normalised)."""
    a = cfg.algorithm
    res = filter_groups(torch.tensor(df["score"].to_numpy(), dtype=torch.float64),
                        torch.tensor(df["group"].to_numpy()), a.filter_ratio, a.filter_type)
    return df[res.keep.numpy()].reset_index(drop=True), res.metrics


def needs_reference(cfg: Config) -> bool:
    return cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward or cfg.algorithm.kl_monitor


def critic_lr_of(cfg: Config) -> dict[str, float]:
    """The critic's parameter groups with their own rate: the value head at critic.value_head_lr when set."""
    return {"value_head": cfg.critic.value_head_lr} if cfg.critic.value_head_lr is not None else {}


def check_resume_state(src: Path, *, critic: bool, lora: bool = False) -> None:
    """A clear error for a checkpoint that holds the actor alone: a DVC checkout of a checkpoint other than the
    run's last (tracking.dvc_resume_state=last versions the critic and optimizer state with the last one only);
    and for a full fine-tune's checkpoint resumed with LoRA on, or the other way round."""
    has_adapters = (src / ADAPTERS / "actor").is_dir()
    if has_adapters != lora:
        held, asked = ("LoRA adapters", "model.lora_rank=0") if has_adapters else ("whole weights", "LoRA")
        raise ValueError(f"checkpoint {src} holds {held} but the config asks for {asked}; resume with the settings "
                         f"the checkpoint was trained with (model.lora_rank)")
    critic_dir = f"{ADAPTERS}/critic" if lora else "critic"
    missing = [d for d in ([critic_dir] if critic else []) + ["deepspeed"] if not (src / d).is_dir()]
    if missing:
        raise FileNotFoundError(f"checkpoint {src} has no {' or '.join(d + '/' for d in missing)} (the resume state); "
                                f"a DVC checkout of a checkpoint other than a run's last holds the actor only "
                                f"(tracking.dvc_resume_state=last): resume from the run's last checkpoint, or load "
                                f"this one's actor/ as model.base to start a new run from it")


class Trainer:
    def __init__(self, cfg: Config, *, resume: str | Path | None = None, model_path: str | None = None,
                 renderer: Any = None) -> None:
        from ragen.train.ranks import announcer

        self.cfg = cfg
        # rank 0 of a launch: the other ranks make each collective call of this trainer with it (train/ranks.py)
        self._announce = announcer()
        if self._announce is not None:
            self._announce.post("open", config_to_dict(cfg), str(resume) if resume is not None else None,
                                model_path)
        base = model_path or ensure_model(cfg.model.base)
        self.base = base
        self.rank, self.world = ensure_distributed()
        self.tokenizer = load_tokenizer(cfg.model.base, cfg.model.tokenizer, cfg.model.trust_remote_code)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else \
            self.tokenizer.eos_token_id
        src = Path(resume) if resume is not None else None
        if src is not None and not (src / COMPLETE).is_file():
            raise FileNotFoundError(f"checkpoint {src} is incomplete or missing (no {COMPLETE} marker); resume from "
                                    f"an earlier checkpoint")
        self.lora: LoraSpec | None = lora_spec(cfg.model)
        if src is not None:
            check_resume_state(src, critic=needs_critic(cfg.algorithm.adv_estimator), lora=self.lora is not None)
        trc = cfg.model.trust_remote_code
        # a LoRA checkpoint holds the adapters only: the frozen base is the run's start, loaded as at its start
        whole = src is not None and self.lora is None
        actor = load_actor(str(src / "actor") if whole else base, trust_remote_code=trc,
                           gradient_checkpointing=cfg.actor.gradient_checkpointing)
        if self.lora is not None:
            add_adapters(actor, self.lora)
            if src is not None:
                load_adapters(actor, src / ADAPTERS / "actor", self.lora)
        o = cfg.actor
        self.actor = make_ds_engine(actor, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, grad_clip=o.grad_clip,
                                 ds_config=o.deepspeed_config)
        self.critic = None
        if needs_critic(cfg.algorithm.adv_estimator):
            critic_src = None if src is None else src / ADAPTERS / "critic" if self.lora else src / "critic"
            critic = load_critic(str(critic_src) if whole else base, trust_remote_code=trc,
                                 gradient_checkpointing=cfg.critic.gradient_checkpointing,
                                 value_head=(critic_src / VALUE_HEAD) if critic_src else None,
                                 value_scale=cfg.critic.value_scale)
            if self.lora is not None:  # the backbone takes adapters; the value head stays fully trained
                add_adapters(critic.backbone, self.lora)
                if critic_src is not None:
                    load_adapters(critic.backbone, critic_src, self.lora)
            c = cfg.critic
            self.critic = make_ds_engine(critic, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay,
                                      grad_clip=c.grad_clip, ds_config=c.deepspeed_config,
                                      lr_of=critic_lr_of(cfg))
        self.ref = load_reference(base, dtype=model_dtype(cfg), trust_remote_code=trc) if needs_reference(cfg) else None
        if src is not None:
            self._load_optimizer_state(src)
        self.probe = probe_batch(renderer, DEFAULT_PROBE) if renderer is not None else None
        self.gate_floor: GateReport | None = None  # set by calibrate(); None: the gate's fixed tolerance

    # -- training -------------------------------------------------------------------------------------------
    def step(self, rollouts: pd.DataFrame, iteration: int = 0) -> UpdateResult:
        """Filter a rollout batch and update on the kept trajectories."""
        kept, filter_metrics = filter_rollouts(self.cfg, rollouts)
        res = self.update(kept, iteration)
        res.metrics.update(filter_metrics)
        return res

    def update(self, batch: pd.DataFrame, iteration: int = 0) -> UpdateResult:
        """Update on an already filtered batch (the pipeline filters in its own stage)."""
        self._tell("update", batch, iteration)
        return update(self.cfg, sequences_from_rollouts(batch), self.actor, critic=self.critic, ref=self.ref,
                      pad_id=self.pad_id, rank=self.rank, world=self.world, iteration=iteration)

    def _tell(self, call: str, *args: Any) -> None:
        if self._announce is not None:
            self._announce.post(call, *args)

    def close(self) -> None:
        """The other ranks of a launch drop their share too (a collapse-guard rollback builds a new trainer)."""
        self._tell("close")
        self._announce = None

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The actor's weights under the plain model's names (LoRA merged): what the rollout engine loads."""
        full = gathered_state(self.actor)
        state = full if full is not None else self.actor.module.state_dict()
        return list((merged_state(state, self.lora.scaling) if self.lora else state).items())

    def _probe(self) -> list[list[int]]:
        if self.probe is None:
            raise RuntimeError("the trainer was built without a renderer, so it has no probe batch for the gate")
        return self.probe

    def calibrate(self, engine: Engine | None) -> GateReport | None:
        """Measure the sync gate's precision floor against an engine that loaded the same weights as this trainer
        (``ragen.rollout.sync.calibrate_gate``); later syncs are gated relative to it. ``None``: a rank without
        the engine takes part in the trainer's side (a collective forward under ZeRO-3)."""
        self._tell("calibrate")
        if engine is None:
            sequence_logprobs(self.actor.module, self._probe(), self.pad_id)
            return None
        r = self.cfg.rollout
        self.gate_floor = calibrate_gate(engine, self.actor.module, self._probe(), pad_token_id=self.pad_id,
                                         mean_tol=r.sync_mean_tol, max_tol=r.sync_max_tol,
                                         factor=r.sync_floor_factor)
        return self.gate_floor

    def sync(self, engine: Engine | None) -> GateReport | None:
        """Send the actor's weights to the rollout engine in place and gate on the probe batch (``None``: the
        trainer's side only, on a rank without the engine)."""
        self._tell("sync")
        if engine is None:
            self.named_weights()
            sequence_logprobs(self.actor.module, self._probe(), self.pad_id)
            return None
        r = self.cfg.rollout
        floor = self.gate_floor.mean_abs if self.gate_floor is not None else None
        return sync_weights(engine, self.named_weights(), self.actor.module, self._probe(), pad_token_id=self.pad_id,
                            mean_tol=r.sync_mean_tol, max_tol=r.sync_max_tol, floor=floor,
                            floor_factor=r.sync_floor_factor)

    # -- checkpoints ----------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """actor/ (safetensors + tokenizer: loadable as model.base by vLLM and transformers), critic/ (backbone
        + value head), deepspeed/ (optimizer and engine state), marker last (ragen.train.checkpoint). With LoRA,
        adapters/actor and adapters/critic (+ value head) instead of actor/ and critic/: the trained weights
        and their optimizer state only, not the frozen base again (``ragen.train.lora.materialize`` gives the
        merged model)."""
        from safetensors.torch import save_file

        self._tell("save", str(path))
        # ZeRO-3: every rank takes part in gathering the weights; rank 0 writes them (None: the modules are whole)
        actor_sd, critic_sd = gathered_state(self.actor), gathered_state(self.critic)

        def part(sd: dict[str, torch.Tensor] | None, prefix: str) -> dict[str, torch.Tensor] | None:
            return None if sd is None else {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}

        def files(tmp: Path) -> None:
            if self.lora is not None:
                adapter_files(tmp / ADAPTERS)
                return
            self.actor.module.save_pretrained(tmp / "actor", safe_serialization=True, state_dict=actor_sd)
            self.tokenizer.save_pretrained(tmp / "actor")
            if self.critic is not None:
                self.critic.module.backbone.save_pretrained(tmp / "critic", safe_serialization=True,
                                                            state_dict=part(critic_sd, "backbone."))
                head = part(critic_sd, "value_head.") or self.critic.module.value_head.state_dict()
                save_file({k: v.contiguous() for k, v in head.items()}, str(tmp / "critic" / VALUE_HEAD))

        def adapter_files(folder: Path) -> None:
            """adapters/actor (+ tokenizer, to materialize the merged model), adapters/critic (+ value head)."""
            assert self.lora is not None
            save_adapters(folder / "actor", actor_sd or self.actor.module.state_dict(), self.lora, self.base)
            self.tokenizer.save_pretrained(folder / "actor")
            if self.critic is not None:
                save_adapters(folder / "critic", part(critic_sd, "backbone.") or
                              self.critic.module.backbone.state_dict(), self.lora, self.base)
                head = part(critic_sd, "value_head.") or self.critic.module.value_head.state_dict()
                save_file({k: v.contiguous() for k, v in head.items()}, str(folder / "critic" / VALUE_HEAD))

        return write_checkpoint(path, rank=self.rank, world=self.world, write_files=files,
                                engines={"actor": self.actor, "critic": self.critic})

    def _load_optimizer_state(self, src: Path) -> None:
        for name, engine, lr in (("actor", self.actor, self.cfg.actor.lr), ("critic", self.critic, self.cfg.critic.lr)):
            if engine is None:
                continue
            d = src / "deepspeed" / name
            if not d.is_dir():
                raise FileNotFoundError(f"checkpoint {src} has no {name} optimizer state ({d})")
            if not load_engine_state(engine, d):
                raise RuntimeError(f"DeepSpeed could not load {d}; the checkpoint may be damaged")
            # the optimizer state carries the learning rate it was saved with; the config's is the one in effect
            # (the same on a plain resume; lower after a collapse-guard rollback, whose remedy it is)
            set_lr(engine, lr)
