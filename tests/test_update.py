"""The StarPO update on the tiny model: batching, DeepSpeed vs plain torch, micro-batch invariance, metrics."""

import numpy as np
import pytest
import torch
from dist_worker import scripted_rollouts

from ragen.config import load_config
from ragen.models import TINY_MODEL, ensure_model
from ragen.train.batch import bucket_micro_batches, fixed_micro_batches, sequences_from_rollouts
from ragen.train.networks import load_actor, load_critic
from ragen.train.plain import PlainEngine
from ragen.train.update import update

SMALL = ["algorithm.filter_ratio=1.0", "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4",
         f"model.base={TINY_MODEL}", "model.dtype=fp32", "envs.train.n_groups=[2]", "envs.train.group_size=4",
         "agent.max_turn=2", "envs.train.tags=[SimpleSokoban]", "agent.max_actions_per_turn=5",
         "agent.enable_think=true", "actor.lr=1e-3", "critic.lr=1e-3", "actor.gradient_checkpointing=false",
         "critic.gradient_checkpointing=false"]


@pytest.mark.unit
def test_bucketing_respects_budget_and_covers_everything():
    lengths = [100, 30, 95, 40, 200, 35]
    mbs = bucket_micro_batches(lengths, token_budget=200)
    assert sorted(i for b in mbs for i in b) == list(range(6))
    for b in mbs:
        assert len(b) * max(lengths[i] for i in b) <= 200 or len(b) == 1
    assert mbs[0] == [4]  # longest alone; then similar lengths together
    assert fixed_micro_batches(5, 2) == [[0, 1], [2, 3], [4]]
    padded = sum(len(b) * max(lengths[i] for i in b) for b in mbs)
    assert padded < sum(len(c) * 200 for c in fixed_micro_batches(6, 2))


@pytest.mark.unit
def test_output_layer_at_the_masked_positions_only_equals_the_whole_forward_there():
    """token_logprobs(positions=mask): the logprobs and entropies of the masked tokens as the full forward pass
    computes them, 0 everywhere else, and gradients that reach the weights; a model that scales its logits
    (here: a softcapping config) takes the full pass."""
    from ragen.train.networks import plain_output_layer, token_logprobs

    torch.manual_seed(0)
    model = load_actor(ensure_model(TINY_MODEL))
    ids = torch.randint(3, 1000, (2, 12))
    attn = torch.ones_like(ids)
    attn[1, 9:] = 0  # right padding
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, [3, 4, 11]] = True
    mask[1, [0, 5, 10]] = True  # position 0 is predicted by nothing; 10 is padding
    full_lp, full_ent = token_logprobs(model, ids, attn, temperature=0.7, with_entropy=True)
    lp, ent = token_logprobs(model, ids, attn, temperature=0.7, with_entropy=True, positions=mask)
    kept = mask & attn.bool()
    kept[:, 0] = False
    assert torch.allclose(lp[kept], full_lp[kept], atol=1e-5) and torch.allclose(ent[kept], full_ent[kept], atol=1e-5)
    assert not lp[~kept].any() and not ent[~kept].any() and lp.shape == ids.shape
    lp[kept].sum().backward()
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0
    assert plain_output_layer(model)
    model.config.final_logit_softcapping = 30.0
    assert not plain_output_layer(model)


@pytest.fixture(scope="module")
def batch(tokenizer, renderer):
    df = batch_frame(tokenizer, renderer)
    assert df["score"].std() > 0  # some variance for the advantages
    return load_config(None, ["cpu-small"], SMALL), sequences_from_rollouts(df)


def engines(cfg, kind, zero="infra/deepspeed/zero0.json"):
    path = ensure_model(TINY_MODEL)
    torch.manual_seed(0)
    actor, critic = load_actor(path), load_critic(path)
    if kind == "plain":
        mk = lambda m, o: PlainEngine(m, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay,  # noqa: E731
                                      grad_clip=o.grad_clip)
    else:
        from ragen.train.ds import make_ds_engine

        mk = lambda m, o: make_ds_engine(m, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay,  # noqa: E731
                                      grad_clip=o.grad_clip, ds_config=zero, dtype="fp32")
    return mk(actor, cfg.actor), mk(critic, cfg.critic)


def flat(engine):
    return torch.cat([p.detach().flatten() for p in engine.module.parameters()])


@pytest.mark.integration
def test_plain_update_metrics_and_steps(batch, tokenizer):
    cfg, seqs = batch
    actor, critic = engines(cfg, "plain")
    before = flat(actor).clone()
    res = update(cfg, seqs, actor, critic=critic, pad_id=tokenizer.pad_token_id)
    m = res.metrics
    assert res.actor_steps == 2 and res.critic_steps == 2 and res.skipped_steps == 0  # 8 trajectories / 4
    assert len(res.lists["actor/grad_norm"]) == 2  # every mini-batch's norm, not only the last
    # first mini-batch: pi == pi_old, so nothing is clipped and the approximate KL is 0
    assert res.lists["actor/pg_clipfrac"][0] == 0.0 and abs(res.lists["actor/ppo_kl"][0]) < 1e-6
    for k in ("actor/pg_loss", "actor/entropy_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm",
              "critic/vf_explained_var"):
        assert np.isfinite(m[k]), k
    assert m["actor/entropy_loss"] > 0 and not torch.equal(before, flat(actor))


@pytest.mark.integration
def test_deepspeed_zero0_equals_plain_torch(batch, tokenizer):
    cfg, seqs = batch
    pa, pc = engines(cfg, "plain")
    da, dc = engines(cfg, "ds")
    rp = update(cfg, seqs, pa, critic=pc, pad_id=tokenizer.pad_token_id)
    rd = update(cfg, seqs, da, critic=dc, pad_id=tokenizer.pad_token_id)
    assert torch.allclose(flat(pa), flat(da), atol=1e-6)
    assert torch.allclose(flat(pc), flat(dc), atol=1e-6)
    assert rp.lists["actor/grad_norm"] == pytest.approx(rd.lists["actor/grad_norm"], rel=1e-5)


@pytest.mark.integration
def test_micro_batching_does_not_change_the_update(batch, tokenizer):
    _, seqs = batch
    bucketed = load_config(None, ["cpu-small"], [*SMALL, "actor.micro_batch_tokens=3000",
                                                  "critic.micro_batch_tokens=3000"])
    one = load_config(None, ["cpu-small"], [*SMALL, "actor.micro_batch_size=1", "critic.micro_batch_size=1"])
    results = []
    for c in (bucketed, one):
        a, cr = engines(c, "plain")
        results.append(update(c, seqs, a, critic=cr, pad_id=tokenizer.pad_token_id).lists)
    # Adam normalises each coordinate's step, which amplifies rounding in near-zero gradients, so compare the
    # quantities the micro-batching could change: every mini-batch's loss and gradient norm
    for k in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "actor/entropy_loss"):
        assert results[0][k] == pytest.approx(results[1][k], rel=1e-4, abs=1e-7), k


@pytest.mark.integration
def test_bf16_autocast_update_is_close_to_fp32(batch, tokenizer):
    """actor/critic.compute_dtype=bf16 autocasts the forward passes (weights and optimizer stay fp32): the first
    mini-batch still has pi == pi_old exactly (scoring and training share the numerics), and every mini-batch's
    losses stay near the fp32 update's. (``keep``: bf16 even where the CPU emulates it, or this compared fp32 twice.)"""
    _, seqs = batch
    bf = load_config(None, ["cpu-small"], [*SMALL, "actor.compute_dtype=bf16", "critic.compute_dtype=bf16",
                                           "model.emulated_bf16=keep"])
    results = {}
    fp32 = load_config(None, ["cpu-small"], [*SMALL, "actor.compute_dtype=fp32", "critic.compute_dtype=fp32"])
    for name, c in (("fp32", fp32), ("bf16", bf)):
        a, cr = engines(c, "plain")
        before = flat(a).clone()
        results[name] = update(c, seqs, a, critic=cr, pad_id=tokenizer.pad_token_id)
        assert next(a.module.parameters()).dtype == torch.float32 and not torch.equal(before, flat(a))
    lb, lf = results["bf16"].lists, results["fp32"].lists
    assert lb["actor/pg_clipfrac"][0] == 0.0 and abs(lb["actor/ppo_kl"][0]) < 1e-6
    assert lb["actor/pg_loss"] == pytest.approx(lf["actor/pg_loss"], rel=0.05, abs=1e-3)  # near 0: abs too
    for k in ("actor/entropy_loss", "critic/vf_loss"):  # the bound for the same batch: 2%
        assert lb[k] == pytest.approx(lf[k], rel=0.02), k
    old = [results[k].metrics["rollout/old_log_prob"] for k in ("bf16", "fp32")]
    assert old[0] == pytest.approx(old[1], rel=0.02) and old[0] != old[1]  # close, and bf16 did run


@pytest.mark.integration
def test_non_finite_loss_skips_the_step(batch, tokenizer):
    cfg, seqs = batch
    a, cr = engines(cfg, "plain")
    with torch.no_grad():
        next(a.module.parameters()).fill_(float("nan"))
    res = update(cfg, seqs, a, critic=cr, pad_id=tokenizer.pad_token_id)
    assert res.actor_steps == 0 and res.skipped_steps == 2 and res.critic_steps == 2  # the critic is unaffected
    assert np.isnan(res.metrics["actor/grad_norm"])


@pytest.mark.integration
@pytest.mark.parametrize("kind,zero", [("plain", None), ("ds", "infra/deepspeed/zero0.json"),
                                       ("ds", "infra/deepspeed/zero2.json")])
def test_non_finite_gradient_with_finite_loss_skips_the_step(batch, tokenizer, kind, zero):
    cfg, seqs = batch
    a, cr = engines(cfg, kind, zero) if zero else engines(cfg, kind)
    # a finite loss whose gradient is NaN: only the norm check (ours, or ZeRO-2's overflow check) can catch it
    next(a.module.parameters()).register_hook(lambda g: g * float("nan"))
    before = flat(a).clone()
    res = update(cfg, seqs, a, critic=cr, pad_id=tokenizer.pad_token_id)
    assert res.actor_steps == 0 and res.skipped_steps == 2 and res.critic_steps == 2
    assert torch.isfinite(flat(a)).all() and torch.equal(flat(a), before)
    assert np.isnan(res.metrics["actor/grad_norm"])


@pytest.mark.integration
def test_grpo_needs_no_critic(batch, tokenizer):
    _, seqs = batch
    g = load_config(None, ["cpu-small"], [*SMALL, "algorithm.adv_estimator=grpo"])
    a, _ = engines(g, "plain")
    res = update(g, seqs, a, pad_id=tokenizer.pad_token_id)
    assert res.actor_steps == 2 and "critic/vf_loss" not in res.metrics


def run_ranks(tmp_path, n, zero, budget=0, timeout=600):
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / f"w{n}-{Path(zero).stem}-{budget}.pt"
    torchrun = Path(sys.executable).with_name("torchrun")
    from ragen.train.ds import free_port

    proc = subprocess.run([str(torchrun), "--nproc_per_node", str(n), "--master_port", str(free_port()),
                           str(Path(__file__).with_name("dist_worker.py")), str(out), zero, str(budget)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


# the scripted batch's trajectories are 282-399 tokens; under a budget of 790 padded tokens per micro-batch, rank 1
# cuts its share of the second mini-batch (387 and 399 tokens) in two and rank 0 (395 and 282) keeps one
UNEVEN = 790


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """The one-rank update every ZeRO stage's two ranks are compared with (run once, not once per stage)."""
    return run_ranks(tmp_path_factory.mktemp("one-rank"), 1, "infra/deepspeed/zero0.json")


@pytest.fixture(scope="module")
def one_rank_uneven(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("one-rank-uneven"), 1, "infra/deepspeed/zero0.json", UNEVEN)


@pytest.mark.integration
@pytest.mark.parametrize(("zero", "budget"), [("infra/deepspeed/zero0.json", 0), ("infra/deepspeed/zero2.json", UNEVEN),
                                              ("infra/deepspeed/zero3.json", UNEVEN)])
def test_two_ranks_give_the_one_rank_update(tmp_path, request, zero, budget):
    """ZeRO-2 and ZeRO-3 on a token budget that gives the ranks different numbers of micro-batches: every rank
    runs as many passes (update.lockstep_passes), where unequal counts hung (the subprocess timeout fails it)."""
    one = request.getfixturevalue("one_rank_uneven" if budget else "one_rank")
    two = run_ranks(tmp_path, 2, zero, budget, timeout=240)
    assert two["world"] == 2
    for part in ("actor", "critic"):
        for k, v in one[part].items():
            assert torch.allclose(v, two[part][k], atol=1e-5), (part, k, float((v - two[part][k]).abs().max()))
    assert one["lists"]["actor/pg_loss"] == pytest.approx(two["lists"]["actor/pg_loss"], rel=1e-4, abs=1e-7)


@pytest.mark.integration
def test_trainer_checkpoint_resume_equals_uninterrupted(batch, tokenizer, renderer, tmp_path):
    from ragen.train.trainer import Trainer

    cfg, _ = batch
    df = batch_frame(tokenizer, renderer)
    torch.manual_seed(0)
    straight = Trainer(cfg, renderer=renderer)
    straight.step(df, 0)
    straight.step(df, 1)
    torch.manual_seed(0)
    first = Trainer(cfg, renderer=renderer)
    first.step(df, 0)
    ckpt = first.save(tmp_path / "ckpt")
    assert (ckpt / "checkpoint-complete").is_file() and (ckpt / "actor" / "model.safetensors").is_file()
    assert not (tmp_path / "ckpt.partial").exists()
    resumed = Trainer(cfg, resume=ckpt, renderer=renderer)
    resumed.step(df, 1)
    assert torch.allclose(flat(straight.actor), flat(resumed.actor), atol=1e-6)
    assert torch.allclose(flat(straight.critic), flat(resumed.critic), atol=1e-6)
    # a resume under lower learning rates (a collapse-guard rollback's remedy) trains with them, not with the
    # rates saved in the optimizer state
    from ragen.config import apply_overrides
    from ragen.train.ds import lrs

    lower = apply_overrides(cfg, [f"actor.lr={cfg.actor.lr / 10}", f"critic.lr={cfg.critic.lr / 100}"])
    remedied = Trainer(lower, resume=ckpt, renderer=renderer)
    assert lrs(remedied.actor) == [pytest.approx(cfg.actor.lr / 10)]
    assert lrs(remedied.critic) == [pytest.approx(cfg.critic.lr / 100)]
    assert lrs(resumed.actor) == [pytest.approx(cfg.actor.lr)]
    (ckpt / "checkpoint-complete").unlink()
    with pytest.raises(FileNotFoundError, match="incomplete"):
        Trainer(cfg, resume=ckpt)


def batch_frame(tokenizer, renderer):
    return scripted_rollouts(load_config(None, ["cpu-small"], SMALL), tokenizer, renderer)


@pytest.mark.unit
def test_token_rewards_place_the_normalised_score_on_the_last_turn_end():
    from ragen.train.batch import Sequences
    from ragen.train.update import token_rewards

    def seq(n, end):
        e = np.zeros(n, dtype=bool)
        e[end] = True
        return e

    seqs = Sequences(input_ids=[np.arange(5), np.arange(4), np.arange(5)],
                     loss_mask=[np.array([0, 1, 1, 0, 1], bool), np.array([0, 1, 1, 1], bool),
                                np.array([0, 0, 1, 1, 1], bool)],
                     rewards=[np.array([0, 0, 0, 0, 1.0]), np.zeros(4), np.array([0, 0, 0, 0, 3.0])],
                     turn_ends=[seq(5, 4), seq(4, 3), seq(5, 4)], scores=np.array([1.0, 0.0, 3.0]),
                     groups=np.array([0, 0, 0]), tags=["a", "a", "a"])
    cfg = load_config(None, [], ["algorithm.reward_norm_method=mean"])
    rewards, scores = token_rewards(cfg, seqs)
    assert scores.tolist() == pytest.approx([-1 / 3, -4 / 3, 5 / 3])
    assert rewards[1, 3].item() == pytest.approx(-4 / 3)  # a zero raw score still gets its normalised value
    assert rewards[0].tolist() == pytest.approx([0, 0, 0, 0, -1 / 3])
    assert int((rewards != 0).sum()) == 3
    identity, _ = token_rewards(load_config(None, [], []), seqs)
    assert identity[2, 4].item() == 3.0 and identity[1].abs().sum() == 0


@pytest.mark.integration
@pytest.mark.parametrize("zero", ["zero2", "zero3"])
def test_bf16_zero_trainer_exports_whole_weights_saves_and_resumes(tokenizer, renderer, tmp_path, zero):
    """The GPU configs (bf16 mixed precision; the paper preset's ZeRO-2, and ZeRO-3, which partitions the
    parameters): the update runs, and the vLLM sync's weights and the checkpoint are whole."""
    from safetensors.torch import load_file

    from ragen.train.trainer import Trainer

    z3 = load_config(None, ["cpu-small"], [*SMALL, f"actor.deepspeed_config=infra/deepspeed/{zero}.json",
                                           f"critic.deepspeed_config=infra/deepspeed/{zero}.json"])
    df = batch_frame(tokenizer, renderer)
    t = Trainer(z3, renderer=renderer)
    assert t.step(df, 0).actor_steps == 2
    named = dict(t.named_weights())
    full = load_actor(ensure_model(TINY_MODEL)).state_dict()
    assert {k: v.shape for k, v in named.items()} == {k: v.shape for k, v in full.items()}
    ckpt = t.save(tmp_path / zero)
    saved = load_file(str(ckpt / "actor" / "model.safetensors"))
    assert saved and all(torch.equal(v, named[k].to(v.dtype)) for k, v in saved.items())
    assert (ckpt / "critic" / "model.safetensors").is_file()
    resumed = Trainer(z3, resume=ckpt, renderer=renderer)
    assert all(torch.equal(v, named[k]) for k, v in resumed.named_weights())


@pytest.mark.unit
def test_shipped_deepspeed_configs_resolve_from_any_directory(tmp_path, monkeypatch):
    """A relative deepspeed_config missing from the working directory falls back to the checkout's shipped file;
    a config that exists nowhere, or is not JSON, is an error naming the file and the setting."""
    from ragen.train.ds import load_ds_config

    monkeypatch.chdir(tmp_path)
    assert load_ds_config("infra/deepspeed/zero2.json", grad_clip=0.5)["zero_optimization"]["stage"] == 2
    (tmp_path / "infra" / "deepspeed").mkdir(parents=True)
    (tmp_path / "infra" / "deepspeed" / "zero2.json").write_text('{"zero_optimization": {"stage": 1}}')
    assert load_ds_config("infra/deepspeed/zero2.json", grad_clip=0.5)["zero_optimization"]["stage"] == 1  # own
    with pytest.raises(FileNotFoundError, match=r"nope\.json does not exist \(actor/critic.deepspeed_config\)"):
        load_ds_config("infra/deepspeed/nope.json", grad_clip=1.0)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match=r"bad\.json is not valid JSON"):
        load_ds_config("bad.json", grad_clip=1.0)


@pytest.mark.unit
def test_advantage_metrics_by_hand():
    """Trained tokens: trajectory 0 has advantages 1, 1, 1 (sum 3), trajectory 1 has -1 (sum -1), trajectory 2
    none. Over the 4 tokens: mean 0.5, unbiased std 1.0, max 1, min -1; token sums 3 and -1: mean |.| 2."""
    from ragen.train.update import advantage_metrics

    adv = torch.tensor([[1.0, 1.0, 1.0, 9.0], [-1.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    m = advantage_metrics(adv, mask)
    assert m == {"critic/advantages/mean": 0.5, "critic/advantages/std": 1.0, "critic/advantages/max": 1.0,
                 "critic/advantages/min": -1.0, "critic/advantages/token_sum_abs_mean": 2.0}
    assert set(advantage_metrics(adv, torch.zeros_like(mask)).values()) == {0.0}
