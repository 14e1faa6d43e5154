"""The StarPO update: actor, critic and reference models, DeepSpeed engines, micro-batching, checkpoints."""
