"""A short StarPO-S run on Bandit with the bundled SmolLM2 (no-think: with <think> it almost never parses yet),
in its own process: vLLM rollouts -> DeepSpeed update -> in-place sync, then the same fixed validation seeds
scored before and after. Prints one JSON line.

Usage: python tests/bandit_learning.py ITERATIONS [key=value overrides...]"""

import json
import sys
import time

OVERRIDES = [
    "envs.train.tags=[Bandit]", "envs.train.n_groups=[8]", "envs.train.group_size=4",
    "envs.val.tags=[Bandit]", "envs.val.n_groups=[128]", "envs.val.group_size=1",
    "agent.enable_think=false", "agent.max_turn=1", "rollout.response_length=24", "rollout.val_temperature=1.0",
    "algorithm.filter_ratio=0.5", "actor.lr=2e-5", "critic.lr=1e-4", "actor.gradient_checkpointing=false",
    "critic.gradient_checkpointing=false", "actor.micro_batch_tokens=4096", "critic.micro_batch_tokens=4096",
]


def main(iterations: int, extra: list[str]) -> None:
    from ragen.agent.chat import ChatRenderer
    from ragen.config import load_config
    from ragen.models import load_tokenizer
    from ragen.rollout.factory import make_engine
    from ragen.rollout.runner import collect
    from ragen.train.trainer import Trainer

    cfg = load_config(None, ["cpu-small"], [*OVERRIDES, *extra])
    tok = load_tokenizer(cfg.model.base)
    renderer = ChatRenderer(tok)
    engine = make_engine(cfg, tok)

    def val() -> dict:
        df = collect(cfg, engine, renderer, mode="val", progress=False).rollouts
        return {"high_arm": int(df["success"].sum()), "n": len(df),
                "format_errors": int(df["num_format_errors"].sum()), "scores": df["score"].tolist()}

    t0 = time.monotonic()
    out = {"before": val(), "train": []}
    print(f"before: {out['before']['high_arm']}/{out['before']['n']} high arm", file=sys.stderr, flush=True)
    trainer = Trainer(cfg, renderer=renderer)
    for k in range(iterations):
        c = collect(cfg, engine, renderer, mode="train", iteration=k, progress=False)
        res = trainer.step(c.rollouts, k)
        gate = trainer.sync(engine)
        out["train"].append({"score": c.metrics["Bandit/score"], "success": c.metrics["Bandit/success"],
                             "grad_norm": res.metrics["actor/grad_norm"], "gate": gate.mean_abs})
        print(f"iteration {k}: {out['train'][-1]} ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    out["after"] = val()
    print(json.dumps(out))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
