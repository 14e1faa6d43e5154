"""One StarPO / StarPO-S update on a (filtered) rollout batch (docs/algorithms.md):

recompute old logprobs -> (reference logprobs) -> values -> token rewards (normalised score, KL in reward)
-> advantages (GAE / bi-level GAE / GRPO) -> critic epochs, then actor epochs, over mini-batches with
micro-batch gradient accumulation, grad clip and non-finite step skipping.

Every rank sees the whole batch's metadata and works on trajectories ``rank::world`` of each mini-batch;
losses carry the whole mini-batch's denominators times the world size, so after DeepSpeed averages gradients
over ranks the update equals the one-rank update of the same batch."""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ragen.algos.advantages import NORM_EPS, compute_advantages, group_index, needs_critic, normalize_scores
from ragen.algos.filtering import group_stats
from ragen.algos.losses import agg_loss, kl_penalty, policy_terms, value_terms
from ragen.algos.masked import explained_variance, masked_mean
from ragen.config import Config
from ragen.models.device import device_of
from ragen.models.precision import runs_bf16
from ragen.train.batch import MicroBatch, Sequences, bucket_micro_batches, collate, fixed_micro_batches, pad_ragged
from ragen.train.ds import begin_micro_batch, collective_device, grad_norm_after_step, grad_norm_before_step
from ragen.train.networks import bf16_autocast, token_logprobs, unwrap


@dataclass
class UpdateResult:
    metrics: dict[str, float]
    actor_steps: int = 0
    critic_steps: int = 0
    skipped_steps: int = 0
    lists: dict[str, list[float]] = field(default_factory=dict)  # per mini-batch values (grad norms, losses)


def micro_batches(seqs: Sequences, index: list[int], *, micro_batch_size: int, token_budget: int,
                  pad_id: int, pad_to: int | None = None) -> list[MicroBatch]:
    """Length-bucketed micro-batches under ``token_budget`` padded tokens when it is set, else fixed chunks in
    order. ``pad_to`` pads every micro-batch to one width (the original's layout, for comparison)."""
    lengths = [len(seqs.input_ids[i]) for i in index]
    if token_budget > 0:
        groups = bucket_micro_batches(lengths, token_budget)
    else:
        groups = fixed_micro_batches(len(index), micro_batch_size)
    return [collate(seqs, [index[j] for j in g], pad_id, pad_to) for g in groups]


def _rows(full: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """The rows of a (B, Lmax) tensor (kept on the CPU) for a micro-batch, cut to its width, on its device."""
    return full[mb.index, :mb.input_ids.shape[1]].to(mb.input_ids.device, non_blocking=True)


@torch.no_grad()
def score_batch(model: Any, seqs: Sequences, mbs: list[MicroBatch], *, temperature: float,
                kind: str, bf16: bool = False) -> torch.Tensor:
    """Old/ref logprobs (kind='logp', at the loss-masked tokens, 0 elsewhere) or values (kind='value') for every
    trajectory, (B, Lmax), fp32; ``bf16`` autocasts the forward passes as the training step that uses them does."""
    out = torch.zeros((len(seqs), int(seqs.lengths.max())), dtype=torch.float32)
    m = unwrap(model)
    dev = device_of(m)
    was_training = m.training
    m.eval()
    for mb in mbs:
        mb = mb.to(dev)
        if kind == "value":
            with bf16_autocast(bf16, dev):
                v = m(mb.input_ids, mb.attention_mask)
            v = v.float()
        else:
            v, _ = token_logprobs(m, mb.input_ids, mb.attention_mask, temperature, bf16=bf16,
                                  positions=mb.loss_mask)  # only the trained tokens' logprobs are read
        out[mb.index, :v.shape[1]] = (v.float() * mb.attention_mask).cpu()
    m.train(was_training)
    return out


def monitor_sample(mbs: list[MicroBatch], n: int) -> list[MicroBatch]:
    """Whole micro-batches, evenly spaced over ``mbs``, that hold at least ``n`` trajectories (all for n = 0 or
    when they hold no more): the KL monitor's sample of a batch."""
    total = sum(len(mb.index) for mb in mbs)
    if n <= 0 or total <= n:
        return mbs
    k = min(len(mbs), max(1, math.ceil(len(mbs) * n / total)))
    picks = sorted({round(i * (len(mbs) - 1) / max(k - 1, 1)) for i in range(k)})
    while sum(len(mbs[i].index) for i in picks) < n:  # short micro-batches among the picks: add the next ones
        picks = sorted({*picks, next(i for i in range(len(mbs)) if i not in picks)})
    return [mbs[i] for i in picks]


def token_rewards(cfg: Config, seqs: Sequences) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense token rewards (B, Lmax) and the per-trajectory score used for them (docs/environments.md, rewards):
    with turn scores off, the (normalised) score sits where the stored reward sits; with turn scores on, the stored
    per-turn rewards are used as they are (no penalty, no normalisation, as the original)."""
    L = int(seqs.lengths.max())
    stored = pad_ragged(seqs.rewards, L)
    scores = torch.tensor(seqs.scores, dtype=torch.float32)
    if cfg.agent.use_turn_scores:
        return stored, scores
    a = cfg.algorithm
    key = {"state": seqs.groups.tolist(), "batch": [0] * len(seqs), "inductive": seqs.tags}[a.reward_norm_grouping]
    normed = normalize_scores(scores, group_index(key), a.reward_norm_method)
    rewards = torch.zeros_like(stored)
    for b in range(len(seqs)):  # the score sits on the last turn's end (also when it is 0 and stored nowhere)
        rewards[b, int(np.flatnonzero(seqs.turn_ends[b])[-1])] = normed[b]
    return rewards, normed


def group_signal(seqs: Sequences) -> torch.Tensor:
    """(B,) bool: whether a trajectory's seed group has reward variance (its members' scores differ). A group of
    one has no group variance to judge by and counts as signal (a critic baseline still gives it one)."""
    groups = torch.as_tensor(np.asarray(seqs.groups))
    ids, std, _, _ = group_stats(torch.as_tensor(np.asarray(seqs.scores, dtype=np.float64)), groups)  # the filter's
    out = torch.ones(len(groups), dtype=torch.bool)
    for g, s in zip(ids, std.tolist(), strict=True):
        sel = groups == g
        if int(sel.sum()) > 1 and s <= NORM_EPS:  # GRPO's "no signal" too
            out[sel] = False
    return out


def update(cfg: Config, seqs: Sequences, actor: Any, *, critic: Any = None, ref: Any = None, pad_id: int,
           rank: int = 0, world: int = 1, iteration: int = 0, pad_to_longest: bool = False) -> UpdateResult:
    """One update. ``actor``/``critic`` are DeepSpeed engines (or anything with backward/step/module);
    ``ref`` a frozen model (needed when a KL term is on or tracked). ``pad_to_longest`` pads every micro-batch to
    the batch's longest trajectory, as the original does (only for measuring what bucketing saves)."""
    t0 = time.perf_counter()
    a, ac, cc = cfg.algorithm, cfg.actor, cfg.critic
    temp = cfg.rollout.temperature
    B, L = len(seqs), int(seqs.lengths.max())
    all_idx = list(range(B))
    pad_to = L if pad_to_longest else None
    order = all_idx  # no shuffling (the original's default); a shuffle would use a seeded permutation here
    if ac.shuffle:
        order = torch.randperm(B, generator=torch.Generator().manual_seed(cfg.trainer.seed + iteration)).tolist()

    def minibatches(size: int) -> list[list[int]]:
        # a smaller last mini-batch uses its own denominators
        return [[order[i] for i in chunk] for chunk in fixed_micro_batches(B, size)]

    def scoring_layout(opt: Any) -> list[MicroBatch]:
        """Every trajectory, in the micro-batches its training step will use (each rank's share of each
        mini-batch): the same shapes give the same rounding, so pi == pi_old exactly on the first step in bf16
        as in fp32."""
        return [mb for mini in minibatches(opt.ppo_mini_batch_size) for r in range(world)
                if (local := _shard(mini, r, world))
                for mb in micro_batches(seqs, local, micro_batch_size=opt.micro_batch_size,
                                        token_budget=opt.micro_batch_tokens, pad_id=pad_id, pad_to=pad_to)]

    score_mbs = scoring_layout(ac)
    mask = pad_ragged(seqs.loss_mask, L, dtype=torch.bool)
    valid = pad_ragged([np.ones(n) for n in seqs.lengths], L, dtype=torch.bool)
    ends = pad_ragged(seqs.turn_ends, L, dtype=torch.bool)
    metrics: dict[str, float] = {}
    lists: dict[str, list[float]] = defaultdict(list)

    actor_bf16, critic_bf16 = runs_bf16(cfg, "actor"), runs_bf16(cfg, "critic")
    clock = _PhaseClock(metrics)
    with clock("actor_scoring"):
        old_logp = score_batch(actor, seqs, score_mbs, temperature=temp, kind="logp", bf16=actor_bf16)
    metrics["rollout/old_log_prob"] = float(masked_mean(old_logp, mask))
    if seqs.sampled_logprobs is not None:  # engine vs trainer on the sampled tokens (bf16 vs fp32, staleness)
        sampled = pad_ragged(seqs.sampled_logprobs, L, value=float("nan"))
        have = mask & torch.isfinite(sampled)
        if have.any():
            gap = (sampled - old_logp).abs()
            metrics["rollout/logprob_mismatch_mean"] = float(gap[have].mean())
            metrics["rollout/logprob_mismatch_max"] = float(gap[have].max())
    ref_logp = None
    if ref is not None:
        monitor_only = not (a.use_kl_in_reward or ac.use_kl_loss)
        ref_mbs = monitor_sample(score_mbs, a.kl_monitor_size) if monitor_only else score_mbs
        with clock("ref_scoring"):
            ref_logp = score_batch(ref, seqs, ref_mbs, temperature=temp, kind="logp", bf16=actor_bf16)
        scored = torch.zeros(B, dtype=torch.bool)
        for mb in ref_mbs:
            scored[mb.index] = True
        seen = mask & scored[:, None]
        metrics["rollout/ref_log_prob"] = float(masked_mean(ref_logp, seen))
        metrics["rollout/kl_old_ref"] = float(masked_mean(kl_penalty(old_logp, ref_logp, a.kl_penalty), seen))
        metrics["rollout/kl_monitor_trajectories"] = float(scored.sum())
    use_critic = needs_critic(a.adv_estimator)
    if use_critic and critic is None:
        raise ValueError(f"algorithm.adv_estimator={a.adv_estimator} needs a critic")
    values = None
    if use_critic:
        with clock("critic_scoring"):
            values = score_batch(critic, seqs, scoring_layout(cc), temperature=1.0, kind="value",
                                 bf16=critic_bf16)
    metrics["timing_s/update_scoring"] = time.perf_counter() - t0

    rewards, scores = token_rewards(cfg, seqs)
    if a.use_kl_in_reward:
        if ref_logp is None:
            raise ValueError("algorithm.use_kl_in_reward needs the reference model")
        rewards = rewards - a.kl_coef * kl_penalty(old_logp, ref_logp, a.kl_penalty) * mask
    # the actor learns only from groups whose members scored differently (algorithm.zero_variance_groups=drop);
    # the critic learns from every kept trajectory
    signal = group_signal(seqs) if a.zero_variance_groups == "drop" else torch.ones(B, dtype=torch.bool)
    actor_mask = mask & signal[:, None]
    metrics["actor/signal_trajectories"] = float(signal.sum())
    metrics["actor/zero_variance_groups"] = float(len(set(seqs.groups[~signal.numpy()].tolist())))
    adv, returns = compute_advantages(
        a.adv_estimator, rewards=rewards, values=values, scores=scores, groups=torch.tensor(np.asarray(seqs.groups)),
        mask=actor_mask, valid=valid, turn_ends=ends if a.bi_level_gae else None, gamma=a.gamma, lam=a.lam,
        bi_level=a.bi_level_gae, high_level_gamma=a.high_level_gamma,
        grpo_norm="mean_std" if a.reward_norm_method != "mean" else "mean", length_weight=a.grpo_length_weight)
    has = bool(actor_mask.any())
    if not has:  # nothing to whiten over; no actor step follows
        adv = torch.zeros_like(adv)
    # the score as the env gave it (veRL's critic/score), and what the update used after reward normalisation
    metrics.update({"critic/score/mean": float(np.mean(seqs.scores)), "critic/rewards/mean": float(scores.mean()),
                    **advantage_metrics(adv, actor_mask)})
    if returns is not None and values is not None:
        metrics["critic/returns/mean"] = float(masked_mean(returns, mask))
        metrics["critic/values/mean"] = float(masked_mean(values, mask))
        metrics["critic/vf_explained_var"] = explained_variance(returns, values, mask)

    result = UpdateResult(metrics)
    # -- critic first (advantages above used the pre-update values) -----------------------------------------
    if use_critic:
        with clock("critic_training"):
            for _ in range(cc.ppo_epochs):
                for mini in minibatches(cc.ppo_mini_batch_size):
                    step_metrics = _critic_step(cfg, critic, seqs, mini, values, returns, mask, pad_id, rank,
                                                world, pad_to, bf16=critic_bf16)
                    _record(result, lists, step_metrics, "critic")
    # -- actor ---------------------------------------------------------------------------------------------
    no_signal = 0
    if iteration >= cfg.trainer.critic_warmup:
        with clock("actor_training"):
            for _ in range(ac.ppo_epochs):
                for mini in minibatches(ac.ppo_mini_batch_size):
                    if not actor_mask[mini].any():  # no signal, no step (AdamW would still move the weights)
                        no_signal += 1
                        continue
                    step_metrics = _actor_step(cfg, actor, seqs, mini, old_logp, ref_logp, adv, actor_mask, pad_id,
                                               rank, world, pad_to, bf16=actor_bf16)
                    _record(result, lists, step_metrics, "actor")
    result.metrics["actor/no_signal_minibatches"] = float(no_signal)
    for k, v in lists.items():
        finite = [x for x in v if math.isfinite(x)]
        result.metrics[k] = float(np.mean(finite)) if finite else float("nan")
    result.metrics["actor/lr"] = ac.lr
    if use_critic:
        result.metrics["critic/lr"] = cc.lr
    result.metrics["timing_s/update"] = time.perf_counter() - t0
    n_tokens = int(sum(seqs.lengths))
    result.metrics["update/tokens"] = float(n_tokens)
    result.metrics["update/tokens_per_s"] = n_tokens / result.metrics["timing_s/update"]
    result.lists = dict(lists)
    return result


def advantage_metrics(adv: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``critic/advantages/*`` of the tokens the actor trains on (``mask``, (b, L)): mean, std (unbiased), max,
    min, and ``token_sum_abs_mean``: per trajectory with any such token the advantage summed over them, its size
    averaged. Whitening is per token, so a long trajectory is pushed up or down as a whole by more than one
    trajectory's share. (The plain mean of the sums is the token mean times the token count: 0 after whitening,
    so it says nothing.) Zeros when nothing is trained."""
    m = mask.bool()
    vals = adv[m]
    if not len(vals):
        return {f"critic/advantages/{k}": 0.0 for k in ("mean", "std", "max", "min", "token_sum_abs_mean")}
    summed = (adv * m).sum(dim=1)[m.any(dim=1)]
    return {"critic/advantages/mean": float(vals.mean()), "critic/advantages/max": float(vals.max()),
            "critic/advantages/min": float(vals.min()),
            "critic/advantages/std": float(vals.std()) if len(vals) > 1 else 0.0,
            "critic/advantages/token_sum_abs_mean": float(summed.abs().mean())}


class _PhaseClock:
    """``with clock("name"):`` adds the block's wall time to ``metrics["timing_s/update_<name>"]``: where an
    update's time goes, per model and pass (the MFU of `ragen bench train` divides by these)."""

    def __init__(self, metrics: dict[str, float]) -> None:
        self.metrics = metrics

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            key = f"timing_s/update_{name}"
            self.metrics[key] = self.metrics.get(key, 0.0) + time.perf_counter() - t0


def _record(result: UpdateResult, lists: dict[str, list[float]], step: dict[str, float], who: str) -> None:
    for k, v in step.items():
        lists[k].append(v)
    skipped = step.get(f"{who}/skipped", 0.0) > 0
    result.skipped_steps += int(skipped)
    if who == "actor":
        result.actor_steps += int(not skipped)
    else:
        result.critic_steps += int(not skipped)


def _shard(mini: list[int], rank: int, world: int) -> list[int]:
    return mini[rank::world]


def boundary_steps(engine: Any, seqs: Sequences, local: list[int], cfg_opt: Any, pad_id: int,
                    loss_fn: Callable[[MicroBatch], tuple[torch.Tensor, dict[str, float]]],
                    world: int, pad_to: int | None = None) -> dict[str, float]:
    """Forward/backward every local micro-batch, the last one on the accumulation boundary, then one step;
    skip the step when a loss or the gradient norm is not finite. Over several ranks every rank runs as many
    forward/backward passes as the rank with the most micro-batches (ZeRO-2 reduces gradients at each backward,
    ZeRO-3 gathers weights at each forward: unequal counts would hang): a rank with fewer repeats its smallest
    micro-batch with its loss times 0, which adds nothing."""
    mbs = micro_batches(seqs, local, micro_batch_size=cfg_opt.micro_batch_size,
                        token_budget=cfg_opt.micro_batch_tokens, pad_id=pad_id, pad_to=pad_to) if local else []
    sums: dict[str, float] = defaultdict(float)
    finite = True
    passes = lockstep_passes(len(mbs), world)
    filler = min(mbs, key=lambda mb: mb.input_ids.numel()) if mbs else None
    for i in range(passes):
        real = i < len(mbs)
        mb = mbs[i] if real else filler
        engine.set_gradient_accumulation_boundary(i == passes - 1)
        begin_micro_batch(engine)
        loss, parts = loss_fn(mb)
        if not real:
            engine.backward(loss * 0.0, scale_wrt_gas=False)  # the collectives of a pass, no gradient
            continue
        finite &= bool(torch.isfinite(loss))
        engine.backward(loss * world, scale_wrt_gas=False)
        for k, v in parts.items():
            sums[k] += v
    if world > 1:  # loss parts are per-rank partial sums of mini-batch quantities
        import torch.distributed as dist

        keys = sorted(sums)
        t = torch.tensor([sums[k] for k in keys] + [0.0 if finite else 1.0], dtype=torch.float64,
                         device=collective_device())
        dist.all_reduce(t)
        sums = defaultdict(float, zip(keys, t[:-1].tolist(), strict=True))
        finite = bool(t[-1] == 0)
    norm = grad_norm_before_step(engine) if finite else float("nan")
    skip = not finite or (norm is not None and not math.isfinite(norm))
    if skip:
        engine.optimizer.zero_grad()
        engine.module.zero_grad(set_to_none=True)
    else:
        engine.step()
        if norm is None:
            norm = grad_norm_after_step(engine)
        # ZeRO-1/2/3 keep gradients in the optimizer and skip an overflowing step themselves: count it as skipped
        if not engine.was_step_applied():
            skip, norm = True, float("nan")
    sums["grad_norm"] = norm
    sums["skipped"] = float(skip)
    return sums


def lockstep_passes(own: int, world: int) -> int:
    """How many forward/backward passes every rank runs for a mini-batch: the most micro-batches any rank has.
    A rank with none is an error on every rank at once (one raising alone would leave the others waiting)."""
    if world == 1:
        if own == 0:
            raise ValueError("a mini-batch with no trajectories")
        return own
    import torch.distributed as dist

    counts = torch.tensor([own, -own], dtype=torch.int64, device=collective_device())
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    most, fewest = int(counts[0]), -int(counts[1])
    if fewest == 0:
        raise ValueError(f"a rank got no trajectories of a mini-batch ({world} ranks): use mini-batches "
                         f"(actor/critic.ppo_mini_batch_size) of at least {world} trajectories")
    return most


def _actor_step(cfg: Config, actor: Any, seqs: Sequences, mini: list[int], old_logp: torch.Tensor,
                ref_logp: torch.Tensor | None, adv: torch.Tensor, mask: torch.Tensor, pad_id: int, rank: int,
                world: int, pad_to: int | None = None, *, bf16: bool) -> dict[str, float]:
    ac = cfg.actor
    mini_mask = mask[mini]
    n_tokens = float(mini_mask.sum().clamp(min=1))
    n_seqs = float(len(mini))
    denom = n_tokens if ac.loss_agg_mode == "token-mean" else n_seqs
    norm_len = int(seqs.lengths[mini].max())
    m = unwrap(actor)
    m.train()
    dev = device_of(m)

    def loss_fn(mb: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        mb = mb.to(dev)
        lp, ent = token_logprobs(m, mb.input_ids, mb.attention_mask, cfg.rollout.temperature, with_entropy=True,
                                 bf16=bf16, positions=mb.loss_mask)
        msk = mb.loss_mask & _rows(mask, mb)  # the trained tokens of trajectories with signal
        terms = policy_terms(lp, _rows(old_logp, mb), _rows(adv, mb), ac.clip_ratio_low, ac.clip_ratio_high,
                             ac.clip_ratio_c)
        pg = agg_loss(terms.loss_mat, msk, ac.loss_agg_mode, denom, norm_len)
        entropy = agg_loss(ent, msk, ac.loss_agg_mode, denom, norm_len)  # type: ignore[arg-type]
        loss = pg - ac.entropy_coeff * entropy
        parts = {"actor/pg_loss": float(pg.detach()), "actor/entropy_loss": float(entropy.detach())}
        if ac.use_kl_loss and ref_logp is not None:
            kl = agg_loss(kl_penalty(lp, _rows(ref_logp, mb), ac.kl_loss_type), msk, ac.loss_agg_mode, denom,
                          norm_len)
            loss = loss + ac.kl_loss_coef * kl
            parts["actor/kl_loss"] = float(kl.detach())
        tok = float(msk.sum().detach())
        parts["actor/pg_clipfrac"] = float((terms.clipped & msk).sum()) / n_tokens
        parts["actor/pg_clipfrac_lower"] = float((terms.dual_clipped & msk).sum()) / n_tokens
        parts["actor/ppo_kl"] = float((terms.neg_approx_kl.detach() * msk).sum()) / n_tokens
        parts["actor/tokens"] = tok
        return loss, parts

    out = boundary_steps(actor, seqs, _shard(mini, rank, world), ac, pad_id, loss_fn, world, pad_to)
    return {("actor/" + k if "/" not in k else k): v for k, v in out.items()}


def _critic_step(cfg: Config, critic: Any, seqs: Sequences, mini: list[int], old_values: torch.Tensor,
                 returns: torch.Tensor, mask: torch.Tensor, pad_id: int, rank: int, world: int,
                 pad_to: int | None = None, *, bf16: bool) -> dict[str, float]:
    cc = cfg.critic
    n_tokens = float(mask[mini].sum().clamp(min=1))
    m = unwrap(critic)
    m.train()
    dev = device_of(m)

    def loss_fn(mb: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        mb = mb.to(dev)
        with bf16_autocast(bf16, dev):
            v = m(mb.input_ids, mb.attention_mask)
        v = v.float()
        s = cc.value_scale  # loss and clip in the head's units (V / value_scale)
        loss_mat, clipped = value_terms(v / s, _rows(old_values, mb) / s, _rows(returns, mb) / s, cc.cliprange_value)
        loss = agg_loss(loss_mat, mb.loss_mask, "token-mean", n_tokens)
        parts = {"critic/vf_loss": float(loss.detach()),
                 "critic/vf_clipfrac": float((clipped & mb.loss_mask).sum()) / n_tokens,
                 "critic/vpred_mean": float((v.detach() * mb.loss_mask).sum()) / n_tokens}
        return loss, parts

    out = boundary_steps(critic, seqs, _shard(mini, rank, world), cc, pad_id, loss_fn, world, pad_to)
    return {("critic/" + k if "/" not in k else k): v for k, v in out.items()}
