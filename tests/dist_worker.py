"""Run one StarPO update on a fixed scripted batch under torchrun; rank 0 saves the updated weights.

Usage: torchrun --nproc_per_node N tests/dist_worker.py OUT.pt ZERO_CONFIG [TOKEN_BUDGET]

TOKEN_BUDGET (default 0: one trajectory per micro-batch) cuts each rank's share by padded tokens instead, so ranks
can get different numbers of micro-batches."""

import itertools
import os
import sys

import torch

ROOM = "#######\n#P__XO#\n#_____#\n#######"
SMALL = ["algorithm.filter_ratio=1.0", "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4",
         "model.base=tiny-random-llama", "model.dtype=fp32", "envs.train.n_groups=[2]", "envs.train.group_size=4",
         "agent.max_turn=2", "envs.train.tags=[SimpleSokoban]", "agent.max_actions_per_turn=5",
         "agent.enable_think=true", "actor.lr=1e-3", "critic.lr=1e-3", "actor.gradient_checkpointing=false",
         "critic.gradient_checkpointing=false", "actor.micro_batch_size=1", "critic.micro_batch_size=1",
         # one trajectory per micro-batch on any rank, in fp32: the sharded update must equal the one-rank
         # update to 1e-5, a bound for the sharding's arithmetic, below bf16's rounding (test_bf16_... checks that)
         "actor.micro_batch_tokens=0", "critic.micro_batch_tokens=0", "actor.compute_dtype=fp32",
         "critic.compute_dtype=fp32"]


def scripted_rollouts(cfg, tokenizer, renderer):
    """SimpleSokoban trajectories on a fixed room with a mix of solving, wrong and garbage answers."""
    from ragen.envs.sokoban.env import SokobanEnv
    from ragen.rollout.runner import collect
    from ragen.rollout.scripted import ScriptedEngine

    original = SokobanEnv.reset
    SokobanEnv.reset = lambda self, *, seed=None, options=None: original(
        self, seed=seed, options={**(options or {}), "room": ROOM})
    flip = itertools.count()
    replies = ["<think>go</think><answer>Right || Right || Right</answer>", "<think>hm</think><answer>Up</answer>",
               "nonsense " * 7]
    try:
        engine = ScriptedEngine(tokenizer, lambda call, prompt: replies[next(flip) % 3])
        return collect(cfg, engine, renderer, progress=False).rollouts
    finally:
        SokobanEnv.reset = original


def main(out: str, zero: str, budget: int = 0) -> None:
    from ragen.agent.chat import ChatRenderer
    from ragen.config import load_config
    from ragen.models import TINY_MODEL, ensure_model, load_tokenizer
    from ragen.train.batch import sequences_from_rollouts
    from ragen.train.ds import ensure_distributed, gathered_state, make_ds_engine
    from ragen.train.networks import load_actor, load_critic
    from ragen.train.update import update

    rank, world = ensure_distributed()
    cfg = load_config(None, ["cpu-small"], [*SMALL, f"actor.micro_batch_tokens={budget}",
                                             f"critic.micro_batch_tokens={budget}"])
    tok = load_tokenizer(TINY_MODEL)
    seqs = sequences_from_rollouts(scripted_rollouts(cfg, tok, ChatRenderer(tok)))
    path = ensure_model(TINY_MODEL)
    torch.manual_seed(0)
    actor, critic = load_actor(path), load_critic(path)
    engines = [make_ds_engine(m, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, grad_clip=o.grad_clip,
                           ds_config=zero, dtype="fp32") for m, o in ((actor, cfg.actor), (critic, cfg.critic))]
    res = update(cfg, seqs, engines[0], critic=engines[1], pad_id=tok.pad_token_id, rank=rank, world=world)
    # ZeRO-3 partitions the weights: every rank takes part in gathering them (what checkpoints and the vLLM sync do)
    states = [gathered_state(e) or {k: v.detach().clone() for k, v in e.module.state_dict().items()}
              for e in engines]
    if rank == 0:
        torch.save({"actor": states[0], "critic": states[1], "lists": res.lists, "world": world}, out)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
