"""StarPO / StarPO-S mathematics as pure tensor functions with masks (docs/algorithms.md). No models here.

Shapes: B trajectories, T token positions. Per-token tensors are aligned with the token they concern (the
value at t refers to predicting token t); ``mask`` (B, T) marks trained tokens, ``valid`` (B, T) marks real
(non-padding) tokens.
"""
