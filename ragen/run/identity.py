"""What makes a run's data: the settings a restart may not change, and the run name hashed from them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ragen.config import REMOVED_KEYS, Config, config_to_dict, flatten

# keys that may differ between the first start of a run and its resume without changing its data
# (prefixes: where runs are logged and versioned is not part of what they compute)
# Settings added to the schema after runs were made with the behaviour their default keeps: at that default they
# are not part of a run's identity, so those runs keep their names (and restarts are not refused) across the addition.
# (the sync gate's calibration only decides whether a run stops, never what a run that goes on computes;
# model.emulated_bf16=fp32 changes nothing on the bf16-native CPU the committed grid ran on)
LATER_KEYS = {"actor.compute_dtype": "fp32", "critic.compute_dtype": "fp32", "rollout.sync_floor_factor": 2.0,
              "model.emulated_bf16": "fp32", "algorithm.zero_variance_groups": "keep", "algorithm.kl_monitor": False,
              "algorithm.kl_monitor_size": 0,
              "critic.value_head_lr": None, "critic.value_scale": 1.0, "envs.train_seeds": None,
              "rollout.kv_cache_memory_gib": None, "rollout.sleep_during_update": True}
RESUME_FREE = ("trainer.total_training_steps", "trainer.resume_state", "rollout.progress", "tracking.",
               "diagnostics.")


def identity(flat: dict[str, Any]) -> dict[str, Any]:
    """The settings that make a run's data, from a flattened config: the warm-start and SFT settings count only
    when the run starts from a warm-start (``model.warm_start`` off, or auto without thinking, leaves them out),
    the collapse guard's only when it is enabled, and ``LATER_KEYS`` only away from the value that computes what
    runs made before they existed computed (their default then), so such a run keeps its identity."""
    ws = flat.get("model.warm_start", "off")
    if ws in ("off", False) or (ws == "auto" and not flat.get("agent.enable_think", True)):
        flat = {k: v for k, v in flat.items() if not k.startswith("sft.") and k != "model.warm_start"}
    if not flat.get("guard.enabled", False):  # an idle collapse guard changes nothing a run makes
        flat = {k: v for k, v in flat.items() if not k.startswith("guard.")}
    return {k: v for k, v in flat.items() if not (k in LATER_KEYS and v == LATER_KEYS[k])}


def config_name(cfg: Config) -> str:
    """A run name from the settings that make a run's data (those a restart may not change): ``p-<hash>``."""
    flat = {k: v for k, v in identity(flatten(config_to_dict(cfg))).items() if not k.startswith(RESUME_FREE)}
    flat = {**REMOVED_KEYS, **flat}  # dropped settings at their one value: runs made before keep their names
    return "p-" + hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:10]
