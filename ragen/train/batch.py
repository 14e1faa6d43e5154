"""Training batches from the rollouts table: per-trajectory token arrays, and micro-batches that waste no
padding (length-bucketed under a token budget) or, for comparison, fixed-size padded micro-batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ragen.rollout.table import dense_rewards


@dataclass
class Sequences:
    """B trajectories as ragged arrays (per-token arrays have each trajectory's own length)."""

    input_ids: list[np.ndarray]
    loss_mask: list[np.ndarray]
    rewards: list[np.ndarray]  # dense token rewards (the stored ones, before normalisation)
    turn_ends: list[np.ndarray]  # bool per token: last trained token of each assistant turn
    scores: np.ndarray  # (B,) raw trajectory score (turn rewards + format penalty)
    groups: np.ndarray  # (B,) seed group id
    tags: list[str]
    sampled_logprobs: list[np.ndarray] | None = None  # the engine's, NaN where not sampled

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.input_ids])

    def subset(self, idx: Sequence[int]) -> Sequences:
        idx = list(idx)
        lps = None if self.sampled_logprobs is None else [self.sampled_logprobs[i] for i in idx]
        return Sequences([self.input_ids[i] for i in idx], [self.loss_mask[i] for i in idx],
                         [self.rewards[i] for i in idx], [self.turn_ends[i] for i in idx], self.scores[idx],
                         self.groups[idx], [self.tags[i] for i in idx], lps)


def sequences_from_rollouts(df: pd.DataFrame) -> Sequences:
    if df.empty:
        raise ValueError("no trajectories to train on (the filter kept none?)")
    ids, masks, rewards, ends = [], [], [], []
    for _, row in df.iterrows():
        n = int(row["length"])
        ids.append(np.asarray(row["input_ids"], dtype=np.int64))
        mask = np.asarray(row["loss_mask"], dtype=bool)
        if mask[0]:
            raise ValueError(f"trajectory {row['env_id']}: the first token cannot be trained (nothing predicts it)")
        masks.append(mask)
        rewards.append(dense_rewards(row))
        e = np.zeros(n, dtype=bool)
        e[np.asarray(row["turn_end_positions"], dtype=np.int64)] = True
        ends.append(e)
    lps = [np.asarray(x, dtype=np.float32) for x in df["sampled_logprobs"]]
    return Sequences(ids, masks, rewards, ends, df["score"].to_numpy(dtype=np.float64),
                     df["group"].to_numpy(dtype=np.int64), df["tag"].astype(str).tolist(), lps)


def bucket_micro_batches(lengths: Sequence[int], token_budget: int, max_size: int | None = None) -> list[list[int]]:
    """Group trajectory indices into micro-batches of similar length whose padded size (count x longest)
    stays within ``token_budget`` (a single longer trajectory gets a micro-batch of its own). Sorted by length
    so padding is small; deterministic (ties by index)."""
    if token_budget < 1:
        raise ValueError("token budget must be >= 1")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[cur[0]] if cur else lengths[i]
        if cur and ((len(cur) + 1) * longest > token_budget or (max_size and len(cur) >= max_size)):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def fixed_micro_batches(n: int, size: int) -> list[list[int]]:
    """The original's layout: consecutive chunks of ``size`` trajectories (padded to the batch's longest)."""
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


@dataclass
class MicroBatch:
    index: list[int]  # positions in the Sequences this came from
    input_ids: torch.Tensor  # (b, L) right-padded
    attention_mask: torch.Tensor  # (b, L) 1 = real token
    loss_mask: torch.Tensor  # (b, L) bool
    turn_ends: torch.Tensor  # (b, L) bool

    @property
    def tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same micro-batch with its tensors on ``device`` (batches are built on the CPU; the model that
        consumes one may live on a GPU)."""
        return MicroBatch(self.index, *(t.to(device, non_blocking=True) for t in
                                        (self.input_ids, self.attention_mask, self.loss_mask, self.turn_ends)))


def collate(seqs: Sequences, index: Sequence[int], pad_id: int, pad_to: int | None = None) -> MicroBatch:
    index = list(index)
    L = pad_to or max(len(seqs.input_ids[i]) for i in index)
    b = len(index)
    ids = torch.full((b, L), pad_id, dtype=torch.long)
    attn = torch.zeros((b, L), dtype=torch.long)
    mask = torch.zeros((b, L), dtype=torch.bool)
    ends = torch.zeros((b, L), dtype=torch.bool)
    for r, i in enumerate(index):
        n = len(seqs.input_ids[i])
        ids[r, :n] = torch.from_numpy(seqs.input_ids[i])
        attn[r, :n] = 1
        mask[r, :n] = torch.from_numpy(seqs.loss_mask[i])
        ends[r, :n] = torch.from_numpy(seqs.turn_ends[i])
    return MicroBatch(index, ids, attn, mask, ends)


def pad_ragged(rows: Sequence[np.ndarray | torch.Tensor], L: int | None = None, value: float = 0.0,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    L = L or max(len(r) for r in rows)
    out = torch.full((len(rows), L), value, dtype=dtype)
    for i, r in enumerate(rows):
        t = torch.as_tensor(np.asarray(r) if not isinstance(r, torch.Tensor) else r, dtype=dtype)
        out[i, :len(t)] = t
    return out
