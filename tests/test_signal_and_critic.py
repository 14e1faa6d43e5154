"""No signal, no step (algorithm.zero_variance_groups) and a critic that can learn (critic.value_head_lr,
critic.value_scale), on the tiny model; and the positive control's training seeds (envs.train_seeds)."""

import numpy as np
import pytest
import torch
from test_update import SMALL, engines, flat

from ragen.config import load_config
from ragen.envs.instances import plan_instances
from ragen.train.batch import MicroBatch, Sequences
from ragen.train.update import group_signal, monitor_sample, update


def sequences(scores, groups, n=6):
    """Trajectories of n tokens (prompt 0-1, response 2..n-1), the score on the last token."""
    B = len(scores)
    rng = np.random.default_rng(0)
    ends = [np.eye(n, dtype=bool)[n - 1] for _ in range(B)]
    return Sequences(input_ids=[rng.integers(3, 500, n) for _ in range(B)],
                     loss_mask=[np.array([0, 0] + [1] * (n - 2), bool) for _ in range(B)],
                     rewards=[np.r_[np.zeros(n - 1), s] for s in scores], turn_ends=ends,
                     scores=np.asarray(scores, dtype=float), groups=np.asarray(groups), tags=["t"] * B)


@pytest.mark.unit
def test_group_signal_marks_groups_whose_members_scored_alike():
    seqs = sequences([1.0, 1.0, 0.0, 2.0, 5.0, -0.1, -0.1], [0, 0, 1, 1, 2, 3, 3])
    # group 0 all 1.0, group 3 all -0.1: no signal; group 1 differs; group 2 is a single trajectory
    assert group_signal(seqs).tolist() == [False, False, True, True, True, False, False]


@pytest.mark.unit
def test_train_seeds_cycle_through_the_given_seeds():
    plan = plan_instances(["A"], [3], 2, base_seed=3 * 2, seed_cycle=[7, 8])  # iteration 2 of 3 groups
    assert [(i.group, i.seed) for i in plan] == [(0, 7), (0, 7), (1, 8), (1, 8), (2, 7), (2, 7)]
    assert [i.seed for i in plan_instances(["A"], [2], 1, base_seed=10)] == [10, 11]
    cfg = load_config(None, [], ["envs.train_seeds=[42]", "envs.train.tags=[SimpleSokoban]", "envs.train.n_groups=[2]",
                                 "envs.train.group_size=2", "algorithm.filter_ratio=1.0",
                                 "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4"])
    from ragen.rollout.runner import instances_for

    for k in (0, 5):
        assert set(instances_for(cfg, "train", k)["seed"]) == {42}
    assert set(instances_for(cfg, "val")["seed"]) != {42}
    with pytest.raises(ValueError, match="train_seeds"):
        load_config(None, [], ["envs.train_seeds=[]"])


GRPO = [*SMALL, "algorithm.adv_estimator=grpo", "actor.ppo_mini_batch_size=8", "actor.lr=1e-2"]


@pytest.mark.integration
def test_a_zero_variance_group_moves_the_actor_no_more_than_its_absence(tokenizer):
    """drop: the batch {no-signal group, signal group} updates the actor exactly as the signal group alone does
    (zero advantage, and none of its tokens in the denominators); keep (the original) differs."""
    pad = tokenizer.pad_token_id
    both = sequences([1.0, 1.0, 1.0, 0.0, 1.0, 0.0], [0, 0, 0, 1, 1, 1])
    alone = Sequences(*[x[3:] for x in (
        both.input_ids, both.loss_mask, both.rewards, both.turn_ends, both.scores, both.groups, both.tags)])
    out = {}
    for name, seqs, mode in (("both-drop", both, "drop"), ("alone", alone, "drop"), ("both-keep", both, "keep")):
        cfg = load_config(None, ["cpu-small"], [*GRPO, f"algorithm.zero_variance_groups={mode}"])
        actor, _ = engines(cfg, "plain")
        res = update(cfg, seqs, actor, pad_id=pad)
        out[name] = (flat(actor), res)
    assert torch.equal(out["both-drop"][0], out["alone"][0])
    assert not torch.allclose(out["both-keep"][0], out["alone"][0])
    m = out["both-drop"][1].metrics
    assert m["actor/zero_variance_groups"] == 1 and m["actor/signal_trajectories"] == 3
    assert out["both-keep"][1].metrics["actor/zero_variance_groups"] == 0


@pytest.mark.integration
def test_no_signal_no_step_but_the_critic_still_learns(tokenizer):
    cfg = load_config(None, ["cpu-small"], [*SMALL, "algorithm.zero_variance_groups=drop"])
    seqs = sequences([1.0, 1.0, 0.5, 0.5], [0, 0, 1, 1])
    actor, critic = engines(cfg, "plain")
    a0, c0 = flat(actor).clone(), flat(critic).clone()
    res = update(cfg, seqs, actor, critic=critic, pad_id=tokenizer.pad_token_id)
    assert res.actor_steps == 0 and res.metrics["actor/no_signal_minibatches"] == 1
    assert torch.equal(flat(actor), a0)  # not even AdamW's weight decay
    assert res.critic_steps == 1 and not torch.equal(flat(critic), c0)


@pytest.mark.integration
def test_value_scale_and_head_rate(tokenizer):
    """value_scale s: the zero-initialised head's first loss is 0.5 * mean((R / s)^2) over the trained tokens;
    value_head_lr: AdamW's first step moves every head weight with a gradient by that rate (|m / sqrt(v)| = 1),
    and halving the critic's rate (the collapse guard's remedy) halves both."""
    from ragen.train.ds import lrs, set_lr
    from ragen.train.plain import PlainEngine
    from ragen.train.trainer import critic_lr_of

    scores = [4.0, 0.0, 10.0, 2.0]
    seqs = sequences(scores, [0, 0, 1, 1])
    cfg = load_config(None, ["cpu-small"], [*SMALL, "critic.value_scale=5.0", "critic.value_head_lr=0.01",
                                            "critic.lr=1e-6", "critic.weight_decay=0.0", "algorithm.gamma=1.0",
                                            "algorithm.lam=1.0", "critic.ppo_mini_batch_size=4"])
    from ragen.models import TINY_MODEL, ensure_model
    from ragen.train.networks import load_critic

    torch.manual_seed(0)
    critic = load_critic(ensure_model(TINY_MODEL), value_scale=cfg.critic.value_scale)
    c = cfg.critic
    eng = PlainEngine(critic, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay, grad_clip=100.0,
                      lr_of=critic_lr_of(cfg))
    actor, _ = engines(cfg, "plain")
    res = update(cfg, seqs, actor, critic=eng, pad_id=tokenizer.pad_token_id)
    # returns = the score at each of the 4 trained tokens of every trajectory (gamma = lam = 1, V = 0)
    assert res.metrics["critic/vf_loss"] == pytest.approx(0.5 * np.mean(np.square(np.array(scores) / 5.0)), rel=1e-5)
    w = critic.value_head.weight.detach()
    moved = w[w != 0].abs()
    assert moved.numel() > 0 and torch.allclose(moved, torch.full_like(moved, 0.01), rtol=1e-3)
    assert lrs(eng) == pytest.approx([1e-6, 0.01])
    set_lr(eng, 0.5e-6)
    assert lrs(eng) == pytest.approx([0.5e-6, 0.005])
    with torch.no_grad():
        critic.value_head.bias.fill_(1.0)
        critic.value_head.weight.zero_()
    ids = torch.tensor(seqs.input_ids[0])[None]
    assert critic(ids, torch.ones_like(ids))[0, 1:].tolist() == pytest.approx([5.0] * 5)  # V = s * head


@pytest.mark.unit
def test_monitor_sample_takes_evenly_spaced_micro_batches_holding_enough_trajectories():
    def mbs(*sizes):
        out, at = [], 0
        for n in sizes:
            e = torch.zeros((n, 1))
            out.append(MicroBatch(list(range(at, at + n)), e.long(), e.long(), e.bool(), e.bool()))
            at += n
        return out

    eight = mbs(*[2] * 8)
    assert monitor_sample(eight, 0) == eight and monitor_sample(eight, 16) == eight == monitor_sample(eight, 99)
    assert [mb.index for mb in monitor_sample(eight, 2)] == [[0, 1]]
    assert [mb.index[0] for mb in monitor_sample(eight, 4)] == [0, 14]  # the first and the last
    assert [mb.index[0] for mb in monitor_sample(eight, 6)] == [0, 8, 14]  # micro-batches 0, 4 and 7
    uneven = mbs(1, 6, 1)  # the spaced picks (first, last) hold 2 of the 3 asked: the one between is added
    assert [mb.index for mb in monitor_sample(uneven, 3)] == [[0], [1, 2, 3, 4, 5, 6], [7]]


@pytest.mark.integration
def test_kl_monitor_scores_the_reference_without_a_kl_term(tokenizer):
    """algorithm.kl_monitor loads the reference for a KL-to-start metric only: 0 while the actor is the start,
    positive once it moved, and the actor's step is the one without a monitor."""
    from ragen.models import TINY_MODEL, ensure_model
    from ragen.train.networks import load_actor
    from ragen.train.trainer import needs_reference

    cfg = load_config(None, ["cpu-small"], [*GRPO, "algorithm.kl_monitor=true"])
    assert needs_reference(cfg) and not needs_reference(load_config(None, ["cpu-small"], GRPO))
    seqs = sequences([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1])
    ref = load_actor(ensure_model(TINY_MODEL)).eval()
    actor, _ = engines(cfg, "plain")
    first = update(cfg, seqs, actor, ref=ref, pad_id=tokenizer.pad_token_id)
    assert first.metrics["rollout/kl_old_ref"] == pytest.approx(0.0, abs=1e-6)
    second = update(cfg, seqs, actor, ref=ref, pad_id=tokenizer.pad_token_id)
    assert abs(second.metrics["rollout/kl_old_ref"]) > 1e-4  # k1 on scripted (not sampled) tokens: either sign
    assert first.metrics["rollout/kl_monitor_trajectories"] == 4
    plain, _ = engines(cfg, "plain")
    update(load_config(None, ["cpu-small"], GRPO), seqs, plain, pad_id=tokenizer.pad_token_id)
    update(load_config(None, ["cpu-small"], GRPO), seqs, plain, pad_id=tokenizer.pad_token_id)
    assert torch.equal(flat(plain), flat(actor))
    sampled = load_config(None, ["cpu-small"], [*GRPO, "algorithm.kl_monitor=true", "algorithm.kl_monitor_size=2",
                                                "actor.micro_batch_size=1", "actor.micro_batch_tokens=0"])
    third = update(sampled, seqs, actor, ref=ref, pad_id=tokenizer.pad_token_id)  # trajectories 0 and 3 scored
    assert third.metrics["rollout/kl_monitor_trajectories"] == 2 and third.metrics["rollout/kl_old_ref"] != 0.0
    # the logged score is the env's (scores 1, 0, 1, 0); the update's rewards are what normalisation made of it
    centred = update(load_config(None, ["cpu-small"], [*GRPO, "algorithm.reward_norm_method=mean"]), seqs, actor,
                     pad_id=tokenizer.pad_token_id).metrics
    assert centred["critic/score/mean"] == first.metrics["critic/score/mean"] == 0.5
    assert centred["critic/rewards/mean"] == pytest.approx(0.0, abs=1e-7)
