"""LoRA for the RL actor and critic (model.lora_rank > 0): the merge by hand and against PEFT's, frozen weights
without gradient or optimizer state, merged weights for the rollout engine, adapter-only checkpoints that resume
bit-exactly, the merged model a checkpoint stands for, and bf16 losses near fp32's."""

import copy

import pytest
import torch
from dist_worker import scripted_rollouts

from ragen.config import load_config
from ragen.models import TINY_MODEL, ensure_model
from ragen.train.lora import (
    ADAPTERS,
    LoraSpec,
    add_adapters,
    load_adapters,
    merge_adapters,
    merged_state,
    save_adapters,
)
from ragen.train.networks import load_actor

SMALL = ["algorithm.filter_ratio=1.0", "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4",
         f"model.base={TINY_MODEL}", "model.dtype=fp32", "envs.train.n_groups=[2]", "envs.train.group_size=4",
         "agent.max_turn=2", "envs.train.tags=[SimpleSokoban]", "agent.max_actions_per_turn=5",
         "agent.enable_think=true", "actor.lr=1e-2", "critic.lr=1e-2", "actor.gradient_checkpointing=false",
         "critic.gradient_checkpointing=false", "model.lora_rank=4", "model.lora_alpha=8"]


@pytest.mark.unit
def test_merge_by_hand():
    """W + (alpha / r) B A: W = I, A = [1 2] (r = 1, 2 inputs), B = [1 0]^T (2 outputs), scaling 2."""
    w = torch.eye(2)
    merged = merge_adapters({"l.weight": w, "l.bias": torch.ones(2)},
                            {"l.lora_A.default.weight": torch.tensor([[1.0, 2.0]]),
                             "l.lora_B.default.weight": torch.tensor([[1.0], [0.0]])}, scaling=2.0)
    assert merged["l.weight"].tolist() == [[3.0, 4.0], [0.0, 1.0]]
    assert merged["l.bias"].tolist() == [1.0, 1.0] and w.tolist() == [[1.0, 0.0], [0.0, 1.0]]  # input untouched
    with pytest.raises(ValueError, match="lacks its A or B"):
        merge_adapters({"l.weight": w}, {"l.lora_A.default.weight": torch.ones(1, 2)}, 1.0)
    assert LoraSpec(64, 32, "all-linear").scaling == 0.5


@pytest.mark.unit
def test_merged_state_equals_peft_merge_and_the_adapted_forward():
    spec = LoraSpec(4, 8, "all-linear")
    m = add_adapters(load_actor(ensure_model(TINY_MODEL)), spec)
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)  # base, embeddings and lm_head frozen
    assert not any("lm_head" in n or "embed" in n for n in trainable)
    torch.manual_seed(1)
    for n, p in m.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.1)  # B starts at 0; a trained one does not
    merged = merged_state(m.state_dict(), spec.scaling)
    plain = load_actor(ensure_model(TINY_MODEL))
    assert set(merged) == set(plain.state_dict())
    # PEFT's own merge of the same adapters
    peft_merged = copy.deepcopy(m)
    from peft.tuners.lora import LoraLayer

    for mod in peft_merged.modules():
        if isinstance(mod, LoraLayer):
            mod.merge()
    ref = {k.replace(".base_layer.", "."): v for k, v in peft_merged.state_dict().items() if ".lora_" not in k}
    assert all(torch.allclose(merged[k], ref[k], atol=1e-6) for k in merged)
    plain.load_state_dict(merged)
    ids = torch.randint(3, 500, (2, 10))
    with torch.no_grad():
        assert torch.allclose(m(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-5)
    with pytest.raises(ValueError, match="matches no module"):
        add_adapters(load_actor(ensure_model(TINY_MODEL)), LoraSpec(4, 8, "no_such_proj"))


@pytest.mark.unit
def test_adapters_refuse_other_settings_and_other_shapes(tmp_path):
    spec = LoraSpec(4, 8, "all-linear")
    m = add_adapters(load_actor(ensure_model(TINY_MODEL)), spec)
    save_adapters(tmp_path / "a", m.state_dict(), spec, "base")
    other = LoraSpec(8, 8, "all-linear")
    with pytest.raises(ValueError, match=r"rank 4 \(checkpoint\) vs 8 \(config\)"):
        load_adapters(add_adapters(load_actor(ensure_model(TINY_MODEL)), other), tmp_path / "a", other)
    few = LoraSpec(4, 8, "q_proj")
    save_adapters(tmp_path / "b", add_adapters(load_actor(ensure_model(TINY_MODEL)), few).state_dict(), spec, "base")
    with pytest.raises(ValueError, match="does not fit the model"):
        load_adapters(m, tmp_path / "b", spec)
    with pytest.raises(FileNotFoundError, match="no LoRA adapters"):
        load_adapters(m, tmp_path / "missing", spec)


def lora_cfg(*extra):
    return load_config(None, ["cpu-small"], [*SMALL, *extra])


def adapters_of(module):
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


@pytest.mark.integration
def test_lora_trainer_trains_adapters_only_and_resumes_bit_exactly(tokenizer, renderer, tmp_path, monkeypatch):
    from ragen.train.checkpoint import model_dir
    from ragen.train.trainer import Trainer

    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path / "cache"))
    cfg = lora_cfg()
    df = scripted_rollouts(cfg, tokenizer, renderer)
    straight = Trainer(cfg, renderer=renderer)
    base = {n: p.detach().clone() for n, p in straight.actor.module.named_parameters() if not p.requires_grad}
    # the optimizer holds the adapters (and the critic's value head) only
    held = {id(p) for g in straight.actor.optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for n, p in straight.actor.module.named_parameters() if ".lora_" in n}
    critic_trainable = [n for n, p in straight.critic.module.named_parameters() if p.requires_grad]
    assert "value_head.weight" in critic_trainable and all(
        ".lora_" in n or n.startswith("value_head.") for n in critic_trainable)
    assert straight.step(df, 0).actor_steps == 2
    after = dict(straight.actor.module.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in base.items())  # the base did not move
    assert all(p.grad is None for n, p in after.items() if n in base)
    straight.step(df, 1)

    first = Trainer(cfg, renderer=renderer)
    first.step(df, 0)
    named = dict(first.named_weights())
    plain = load_actor(ensure_model(TINY_MODEL)).state_dict()
    assert {k: v.shape for k, v in named.items()} == {k: v.shape for k, v in plain.items()}
    assert any(not torch.equal(named[k], plain[k]) for k in plain)  # what the engine gets has moved
    ckpt = first.save(tmp_path / "ckpt")
    assert not (ckpt / "actor").exists() and not (ckpt / "critic").exists()
    size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())  # optimizer state included
    base_size = sum(v.numel() * v.element_size() for v in plain.values())
    assert size < base_size / 5, (size, base_size)  # adapters (+ value head), not the model (or its copy) again
    resumed = Trainer(cfg, resume=ckpt, renderer=renderer)
    assert all(torch.equal(v, adapters_of(first.actor.module)[n]) for n, v in adapters_of(resumed.actor.module).items())
    resumed.step(df, 1)
    for a, b in ((straight.actor, resumed.actor), (straight.critic, resumed.critic)):
        sa, sb = adapters_of(a.module), adapters_of(b.module)
        assert sa.keys() == sb.keys() and all(torch.equal(sa[n], sb[n]) for n in sa)

    # the checkpoint as a model directory: the merged actor, written once into the cache
    merged = model_dir(ckpt)
    assert merged is not None and str(merged).startswith(str(tmp_path / "cache"))
    from safetensors.torch import load_file

    on_disk = load_file(str(merged / "model.safetensors"))
    assert all(torch.allclose(on_disk[k], named[k], atol=1e-6) for k in on_disk)
    assert model_dir(ckpt) == merged

    with pytest.raises(ValueError, match="holds LoRA adapters"):
        Trainer(lora_cfg("model.lora_rank=0"), resume=ckpt)
    with pytest.raises(ValueError, match="other LoRA settings"):
        Trainer(lora_cfg("model.lora_alpha=16"), resume=ckpt)


@pytest.mark.integration
def test_lora_bf16_losses_are_close_to_fp32(tokenizer, renderer):
    """The same batch with bf16 autocast and in fp32, LoRA on: every mini-batch's entropy and value loss within
    2%, and the first mini-batch still has pi == pi_old."""
    from ragen.train.batch import sequences_from_rollouts
    from ragen.train.plain import PlainEngine
    from ragen.train.update import update

    fp32 = lora_cfg("actor.compute_dtype=fp32", "critic.compute_dtype=fp32")
    bf = lora_cfg("actor.compute_dtype=bf16", "critic.compute_dtype=bf16", "model.emulated_bf16=keep")
    seqs = sequences_from_rollouts(scripted_rollouts(fp32, tokenizer, renderer))
    from ragen.train.networks import load_critic

    spec = LoraSpec(4, 8, "all-linear")
    out = {}
    for name, c in (("fp32", fp32), ("bf16", bf)):
        actor = add_adapters(load_actor(ensure_model(TINY_MODEL)), spec)
        critic = load_critic(ensure_model(TINY_MODEL))
        add_adapters(critic.backbone, spec)

        def mk(m, o):
            return PlainEngine(m, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, grad_clip=o.grad_clip)

        out[name] = update(c, seqs, mk(actor, c.actor), critic=mk(critic, c.critic), pad_id=tokenizer.pad_token_id)
    lb, lf = out["bf16"].lists, out["fp32"].lists
    assert abs(lb["actor/ppo_kl"][0]) < 1e-6
    for k in ("actor/entropy_loss", "critic/vf_loss"):
        assert lb[k] == pytest.approx(lf[k], rel=0.02), k


@pytest.mark.integration
def test_lora_run_stopped_and_continued_ends_as_uninterrupted(tmp_path, monkeypatch):
    """The loop with LoRA on: the resumed run's rollout engine starts from the checkpoint's merged weights (the
    sync gate would fail otherwise) and the run ends where the uninterrupted one does."""
    from test_loop import cfg

    from ragen.run.loop import run_training
    from ragen.train.lora import ADAPTER_FILE

    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path / "cache"))
    lora = ["model.lora_rank=4", "model.lora_alpha=8", "trainer.checkpoint_every=1", "actor.lr=1e-2",
            "critic.lr=1e-2"]
    full = run_training(cfg(tmp_path, 2, *lora), "full")
    assert run_training(cfg(tmp_path, 1, *lora), "split").iterations == [0]
    rest = run_training(cfg(tmp_path, 2, *lora), "split")
    assert rest.iterations == [1]
    for key in ("train/SimpleSokoban/score", "actor/pg_loss", "critic/vf_loss", "val/score"):
        assert rest.metrics[1][key] == pytest.approx(full.metrics[1][key], rel=1e-5, abs=1e-7), key
    from safetensors.torch import load_file

    a, b = (load_file(str(r.run.state(1) / ADAPTERS / "actor" / ADAPTER_FILE)) for r in (full, rest))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.integration
@pytest.mark.parametrize("zero", ["zero2", "zero3"])
def test_lora_under_zero_saves_no_frozen_weights_and_resumes(tokenizer, renderer, tmp_path, zero):
    """ZeRO-2 keeps frozen weights as fragments and ZeRO-3 holds the only whole copy of the trained ones in its
    own files: neither checkpoint carries the frozen base, and a resume exports the same merged weights."""
    from ragen.train.trainer import Trainer

    cfg = lora_cfg(f"actor.deepspeed_config=infra/deepspeed/{zero}.json",
                   f"critic.deepspeed_config=infra/deepspeed/{zero}.json")
    t = Trainer(cfg, renderer=renderer)
    t.step(scripted_rollouts(cfg, tokenizer, renderer), 0)
    named = dict(t.named_weights())
    ckpt = t.save(tmp_path / zero)
    base_size = sum(v.numel() * v.element_size() for v in load_actor(ensure_model(TINY_MODEL)).state_dict().values())
    assert sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()) < base_size / 5
    resumed = Trainer(cfg, resume=ckpt, renderer=renderer)
    assert all(torch.equal(v, named[k]) for k, v in resumed.named_weights())


@pytest.mark.unit
def test_the_merged_model_cache_keeps_the_most_recently_used(tmp_path):
    import os

    from ragen.train.lora import prune_merged

    for i, name in enumerate("abcde"):
        (tmp_path / name).mkdir()
        marker = tmp_path / name / "merged-complete"
        marker.write_text("")
        os.utime(marker, (1000 + i, 1000 + i))  # e is the most recent
    (tmp_path / "writing").mkdir()  # no marker: another process is writing it
    gone = prune_merged(tmp_path, keep=2)
    assert sorted(p.name for p in gone) == ["a", "b", "c"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "e", "writing"]
