"""``ragen bench train``: the update measured against the machine it runs on.

Two fixed batches made by a scripted engine (no sampling, so every run sees the same tokens): the main command's
(Bandit, one short no-think answer, the 16 trajectories its filter keeps) and a multi-turn one (SimpleSokoban with
thinking, 5 turns, the multi-turn experiments' settings). Each gets one real StarPO-S update (actor and critic as
DeepSpeed engines, the main command's settings otherwise) in the precision the update computes in here; its
per-pass wall times and the model FLOPs of those passes (``ragen.train.flops``) give the achieved FLOP/s and the
MFU over the machine's matrix throughput in the model's shapes, for that dtype.

The main batch is also updated in fp32 (where the default is bf16), with plain torch instead of DeepSpeed, padded
to its longest trajectory instead of length-bucketed, and with LoRA adapters instead of full fine-tuning: the
ratios of those say what each choice is worth, and the fp32 losses are the reference the bf16 ones must stay
within 2% of. LoRA's MFU divides the FLOPs it actually computes (frozen weights take no weight gradient)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from ragen.config import Config, load_config
from ragen.experiments import MULTI_TURN_CPU, SOKOBAN
from ragen.train.batch import Sequences
from ragen.train.flops import Architecture, lora_pass_flops, matmul_tflops, model_shapes, pass_flops
from ragen.train.lora import LoraSpec, add_adapters

MAIN_PRESETS = ("cpu-small",)  # params.yaml is this preset over the defaults: the main command's settings
# the kept batch of the main command: 2 of its 8 groups x 8 (the 25% filter), all kept here
MAIN = ("envs.train.n_groups=[2]", "envs.train.group_size=8", "algorithm.filter_ratio=1.0")
# a multi-turn batch as the multi-turn experiments train on at cpu-small, 2 groups x 4, in two mini-batches
MULTITURN = (*SOKOBAN, *MULTI_TURN_CPU, "envs.train.n_groups=[2]", "envs.train.group_size=4",
             "algorithm.filter_ratio=1.0", "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4")
BATCHES = {"main": MAIN, "multiturn": MULTITURN}
# losses compared between the update's precision and fp32 on the same batch (pg_loss is left out: with whitened
# advantages and a ratio of 1 on the first step it is a difference of near-equal numbers, not a scale)
COMPARED_LOSSES = ("rollout/old_log_prob", "actor/entropy_loss", "critic/vf_loss")
WORDS = ("left", "box", "wall", "push", "the", "target", "so", "then", "up", "I", "should", "move")


def batch_config(name: str, model: str, extra: Sequence[str] = ()) -> Config:
    if name not in BATCHES:
        raise ValueError(f"unknown batch {name!r}; use one of {', '.join(BATCHES)}")
    return load_config(None, list(MAIN_PRESETS), [f"model.base={model}", *BATCHES[name], *extra])


def scripted_batch(cfg: Config, tokenizer: Any, seed: int) -> Sequences:
    """Rollouts of ``cfg``'s train envs with scripted replies: thinking (when on) of random words up to the
    response length, then a valid-looking action (Bandit arms, grid moves)."""
    import numpy as np

    from ragen.agent.chat import ChatRenderer
    from ragen.rollout.runner import collect
    from ragen.rollout.scripted import ScriptedEngine
    from ragen.train.batch import sequences_from_rollouts

    rng = np.random.default_rng(seed)
    think = cfg.agent.enable_think
    cap = cfg.rollout.response_length

    def reply(call: int, prompt: Sequence[int]) -> str:
        text = tokenizer.decode(list(prompt[-400:]))
        bandit = "arm" in text.lower() and "Sokoban" not in text
        move = ["phoenix", "dragon"][int(rng.integers(0, 2))] if bandit else \
            ["Up", "Down", "Left", "Right"][int(rng.integers(0, 4))]
        thought = " ".join(rng.choice(WORDS, size=int(rng.integers(cap // 3, cap // 2)))) if think else ""
        return (f"<think>{thought}</think>" if think else "") + f"<answer>{move}</answer>"

    renderer = ChatRenderer(tokenizer, cfg.model.end_of_turn_token)
    return sequences_from_rollouts(collect(cfg, ScriptedEngine(tokenizer, reply), renderer, progress=False).rollouts)


def update_device() -> str:
    """Where the update runs, so where its peak is timed: DeepSpeed's accelerator (CUDA on a GPU machine)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def peak_tflops(arch: Architecture, dtypes: Sequence[str], tokens: int = 2048, outputs: int = 256
                ) -> tuple[dict[str, float | None], dict[str, dict[str, float]]]:
    """The best measured matmul throughput per dtype over the model's shapes, and every shape's, on the device
    the update runs on."""
    torch_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    shapes = model_shapes(arch, tokens, outputs)
    each = {d: matmul_tflops(shapes, torch_dtypes[d], device=update_device()) for d in dtypes}
    peak: dict[str, float | None] = {"fp32": None, "bf16": None}
    peak.update({d: max(v.values()) for d, v in each.items()})
    return peak, each


def update_flops(seqs: Sequences, arch: Architecture, cfg: Config, adapter_weights: int = 0) -> dict[str, float]:
    """Model FLOPs of one update's passes: per model, the scoring pass (forward) and the training passes
    (forward + backward, once per PPO epoch); the actor's output layer at the trained tokens only. Actor and
    critic share the decoder (the critic is its backbone with a value head), so one ``arch`` counts both.
    ``adapter_weights`` > 0: each model carries that many LoRA weights and trains only them (and the value head)."""
    lengths = [int(n) for n in seqs.lengths]
    trained = int(sum(int(m.sum()) for m in seqs.loss_mask))
    real = int(sum(lengths))

    def count(outputs: int, head_width: int, backward: bool) -> float:
        if adapter_weights:
            return lora_pass_flops(arch, lengths, outputs, head_width=head_width, backward=backward,
                                   adapter_weights=adapter_weights, head_trained=head_width == 1)
        return pass_flops(arch, lengths, outputs, head_width=head_width, backward=backward)

    return {
        "actor_scoring": count(trained, arch.vocab, False),
        "actor_training": cfg.actor.ppo_epochs * count(trained, arch.vocab, True),
        "critic_scoring": count(real, 1, False),
        "critic_training": cfg.critic.ppo_epochs * count(trained, 1, True),
    }


def pass_seconds(m: dict[str, float]) -> dict[str, float]:
    """Wall seconds of each model's scoring and training passes in an update's metrics."""
    return {k.removeprefix("timing_s/update_"): v for k, v in m.items()
            if k.startswith("timing_s/update_") and k != "timing_s/update_scoring"}


def achieved_tflops(m: dict[str, float], flops: dict[str, float], who: str) -> float:
    """``who``'s (actor or critic) model FLOPs over the seconds of its scoring and training passes, in TFLOP/s."""
    secs = m[f"timing_s/update_{who}_scoring"] + m[f"timing_s/update_{who}_training"]
    return (flops[f"{who}_scoring"] + flops[f"{who}_training"]) / secs / 1e12


def run_update(cfg: Config, seqs: Sequences, path: str, pad_id: int, *, engine: str = "deepspeed",
               padded: bool = False, compute_dtype: str | None = None, seed: int = 0,
               lora: LoraSpec | None = None) -> dict[str, float]:
    """One update of fresh actor and critic on ``seqs`` (with ``lora``: adapters on both, the rest frozen); its
    metrics (losses, per-pass timings), wall time and the adapters' weight count."""
    from ragen.train.ds import make_ds_engine
    from ragen.train.networks import load_actor, load_critic
    from ragen.train.plain import PlainEngine
    from ragen.train.trainer import critic_lr_of
    from ragen.train.update import update

    if compute_dtype is not None:
        cfg = cfg.model_copy(update={s: getattr(cfg, s).model_copy(update={"compute_dtype": compute_dtype})
                                     for s in ("actor", "critic")})
    torch.manual_seed(seed)
    models = {"actor": load_actor(path, gradient_checkpointing=cfg.actor.gradient_checkpointing),
              "critic": load_critic(path, gradient_checkpointing=cfg.critic.gradient_checkpointing,
                                    value_scale=cfg.critic.value_scale)}
    adapter_weights = 0
    if lora is not None:
        add_adapters(models["actor"], lora)
        add_adapters(models["critic"].backbone, lora)
        adapter_weights = sum(p.numel() for n, p in models["actor"].named_parameters() if ".lora_" in n)
    engines = {}
    for name, module in models.items():
        o = getattr(cfg, name)
        kw = dict(lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, grad_clip=o.grad_clip,
                  lr_of=critic_lr_of(cfg) if name == "critic" else None)
        engines[name] = make_ds_engine(module, ds_config=o.deepspeed_config, **kw) if engine == "deepspeed" else \
            PlainEngine(module, **kw)
    t0 = time.perf_counter()
    res = update(cfg, seqs, engines["actor"], critic=engines["critic"], pad_id=pad_id, pad_to_longest=padded)
    return {**res.metrics, "wall_s": time.perf_counter() - t0, "adapter_weights": float(adapter_weights)}


def bench_train(*, model: str = "smollm2-135m-instruct", batches: Sequence[str] = ("main", "multiturn"),
                compare: bool = True, seed: int = 0, lora_rank: int = 64, progress: Any = None) -> dict[str, Any]:
    """The JSON of `ragen bench train` (see the module doc); ``compare`` adds the fp32, plain-torch, padded and
    LoRA (``lora_rank``, alpha = rank, all linear layers; 0: left out) runs of the main batch (their ratios and
    the loss check)."""
    from ragen.models import ensure_model, load_tokenizer
    from ragen.models.precision import hardware, native_bf16, runs_bf16
    from ragen.train.networks import load_actor

    say = progress or (lambda _msg: None)
    path = ensure_model(model)
    cfgs = {b: batch_config(b, model) for b in batches}
    first = cfgs[batches[0]]
    tok = load_tokenizer(first.model.base, first.model.tokenizer)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    arch = Architecture.of(load_actor(path))
    dtypes = ["fp32", "bf16"] if native_bf16() else ["fp32"]
    say(f"matrix throughput in the model's shapes ({', '.join(dtypes)})")
    peak, shapes = peak_tflops(arch, dtypes)
    compute_dtype = "bf16" if runs_bf16(first, "actor") else "fp32"
    out: dict[str, Any] = {"model": model, "hardware": hardware(), "device": update_device(),
                           "threads": torch.get_num_threads(),
                           "compute_dtype": compute_dtype, "peak_tflops": peak, "matmul_tflops": shapes,
                           "mfu": {}, "achieved_tflops": {}, "batches": {}}
    for b, cfg in cfgs.items():
        seqs = scripted_batch(cfg, tok, seed)
        say(f"{b}: {len(seqs)} trajectories, {int(seqs.lengths.sum())} tokens; update in {compute_dtype}")
        m = run_update(cfg, seqs, path, pad_id, seed=seed)
        flops = update_flops(seqs, arch, cfg)
        info: dict[str, Any] = {"trajectories": len(seqs), "tokens": int(seqs.lengths.sum()),
                                "trained_tokens": int(sum(int(x.sum()) for x in seqs.loss_mask)),
                                "max_len": int(seqs.lengths.max()), "update_s": m["wall_s"],
                                "seconds": pass_seconds(m), "model_tflop": {k: v / 1e12 for k, v in flops.items()},
                                "losses": {k: m[k] for k in COMPARED_LOSSES if k in m}}
        info["tflops_overall"] = sum(flops.values()) / 1e12 / m["wall_s"]
        for who in ("actor", "critic"):
            achieved = achieved_tflops(m, flops, who)
            out["achieved_tflops"][f"{b}/{who}"] = achieved
            out["mfu"][f"{b}/{who}"] = achieved / float(peak[compute_dtype])  # type: ignore[arg-type]
        say(f"{b}: update {m['wall_s']:.1f} s, MFU actor {out['mfu'][f'{b}/actor']:.0%} critic "
            f"{out['mfu'][f'{b}/critic']:.0%} of the {compute_dtype} peak {peak[compute_dtype]:.2f} TFLOP/s")
        if compare and b == "main":
            _compare(info, out, cfg, seqs, path, pad_id, seed, compute_dtype, m, say)
            if lora_rank > 0:
                out["lora"] = _lora(cfg, seqs, arch, path, pad_id, seed, float(peak[compute_dtype]),  # type: ignore[arg-type]
                                    LoraSpec(lora_rank, lora_rank, "all-linear"), say)
        out["batches"][b] = info
    return out


def _compare(info: dict[str, Any], out: dict[str, Any], cfg: Config, seqs: Sequences, path: str, pad_id: int,
             seed: int, compute_dtype: str, chosen: dict[str, float], say: Any) -> None:
    """The main batch again in fp32, with plain torch and padded: ratios of update tokens/s, and the loss check."""
    def rate(m: dict[str, float]) -> float:
        return 1.0 / m["wall_s"]

    fp32 = chosen
    if compute_dtype != "fp32":
        say("main: the same update in fp32 (the losses' reference)")
        fp32 = run_update(cfg, seqs, path, pad_id, compute_dtype="fp32", seed=seed)
        out["bf16_over_fp32"] = rate(chosen) / rate(fp32)
    info["losses_fp32"] = {k: fp32[k] for k in COMPARED_LOSSES if k in fp32}
    info["loss_rel_diff"] = {k: abs(info["losses"][k] - v) / abs(v) if v else 0.0
                             for k, v in info["losses_fp32"].items()}
    say("main: plain torch AdamW instead of DeepSpeed")
    out["deepspeed_over_plain"] = rate(chosen) / rate(run_update(cfg, seqs, path, pad_id, engine="plain", seed=seed))
    say("main: micro-batches padded to the longest trajectory")
    out["bucketed_over_padded"] = rate(chosen) / rate(run_update(cfg, seqs, path, pad_id, padded=True, seed=seed))


def _lora(cfg: Config, seqs: Sequences, arch: Architecture, path: str, pad_id: int, seed: int, peak: float,
          spec: LoraSpec, say: Any) -> dict[str, Any]:
    """The main batch's update with LoRA adapters: seconds, the FLOPs it computes, MFU, and its speed over a full
    fine-tune of the same batch timed right before it (the first update of a process also pays one-time costs,
    such as DeepSpeed compiling its ops, so it is not the one compared)."""
    say("main: the full fine-tune again, then with LoRA")
    full = run_update(cfg, seqs, path, pad_id, seed=seed)
    say(f"main: LoRA rank {spec.rank} on actor and critic instead of full fine-tuning")
    m = run_update(cfg, seqs, path, pad_id, seed=seed, lora=spec)
    flops = update_flops(seqs, arch, cfg, adapter_weights=int(m["adapter_weights"]))
    res: dict[str, Any] = {"rank": spec.rank, "alpha": spec.alpha, "adapter_weights": int(m["adapter_weights"]),
                           "update_s": m["wall_s"], "full_update_s": full["wall_s"],
                           "lora_over_full": full["wall_s"] / m["wall_s"],
                           "seconds": pass_seconds(m), "model_tflop": {k: v / 1e12 for k, v in flops.items()},
                           "mfu": {who: achieved_tflops(m, flops, who) / peak for who in ("actor", "critic")}}
    say(f"main: LoRA update {m['wall_s']:.1f} s ({res['lora_over_full']:.2f}x the full fine-tune's speed), MFU "
        f"actor {res['mfu']['actor']:.0%} critic {res['mfu']['critic']:.0%}")
    return res
