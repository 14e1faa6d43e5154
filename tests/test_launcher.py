"""The whole loop under a launcher: `torchrun --nproc_per_node 2 ragen train` (gloo on this CPU) runs the loop on
rank 0 and the update on both ranks, and ends where one process running the same iterations ends. With vLLM,
every rank holds an engine and generates its share of each call (ragen/rollout/shards.py); stopped after one
iteration and launched again, such a run ends as if never stopped."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file
from test_guard import ALWAYS_TRIPS
from test_loop import TINY

from ragen.run.rundir import RunDir
from ragen.train.ds import free_port

pytestmark = pytest.mark.integration

# fp32 and one trajectory per micro-batch: the 2-rank update equals the 1-rank one to float rounding (as in
# test_update.py's two-rank test), so the second iteration's rollouts sample the same tokens
EXACT = ["trainer.val_before_train=false", "actor.micro_batch_tokens=0", "critic.micro_batch_tokens=0",
         "actor.micro_batch_size=1", "critic.micro_batch_size=1", "actor.compute_dtype=fp32",
         "critic.compute_dtype=fp32"]


def launch_command(tmp_path: Path, prefect_api: str, iterations: int, *flags: str, run: str = "two",
                   extra: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    over = [*TINY, *EXACT, f"trainer.run_dir={tmp_path / 'runs'}", "tracking.dvc=false",
            f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'm.db'}",
            f"tracking.mlflow_artifact_location={tmp_path / 'mlartifacts'}", *extra]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "--no-python", str(Path(sys.executable).with_name("ragen")),
           "train", "--run-name", run, "--preset", "cpu-small", "--iterations", str(iterations), *flags,
           *[a for o in over for a in ("--set", o)]]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PREFECT_API_URL=prefect_api, OMP_NUM_THREADS="1")
    return cmd, env


def launch(tmp_path: Path, prefect_api: str, iterations: int, *flags: str, run: str = "two",
           extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    cmd, env = launch_command(tmp_path, prefect_api, iterations, *flags, run=run, extra=extra)
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)


def test_two_ranks_run_the_whole_loop_and_match_one_process(tmp_path, prefect_api, one_process_run):
    two_ranks = launch(tmp_path, prefect_api, 2)
    assert two_ranks.returncode == 0, two_ranks.stderr[-4000:]
    assert "completed iterations 0..1" in two_ranks.stdout
    one = one_process_run
    two = RunDir(tmp_path / "runs" / "two")
    assert_same_iterations(one, two, rel=1e-4)
    # the all-reduce sums in another order than one process does; Adam divides each gradient by its own running
    # scale, so parameters whose gradients are near zero show that rounding as a few percent of one step
    # (3e-5 measured after two steps at lr 1e-3): bound at a tenth of a step
    gap = weights_gap(one, two)
    assert gap < 1e-4, gap


VLLM = ("rollout.engine=vllm", "rollout.kv_cache_gib=1")


def test_two_ranks_share_vllm_rollouts_and_a_relaunch_ends_as_if_never_stopped(tmp_path, prefect_api):
    whole = launch(tmp_path, prefect_api, 2, "--no-prefect", run="whole", extra=VLLM)
    assert whole.returncode == 0, whole.stderr[-4000:]
    first = launch(tmp_path, prefect_api, 1, "--no-prefect", run="split", extra=VLLM)
    assert first.returncode == 0, first.stderr[-4000:]
    # both ranks build their engines again, from iteration 0's checkpoint
    rest = launch(tmp_path, prefect_api, 2, "--no-prefect", run="split", extra=VLLM)
    assert rest.returncode == 0, rest.stderr[-4000:]
    assert "completed iterations 1..1" in rest.stdout
    a, b = RunDir(tmp_path / "runs" / "whole"), RunDir(tmp_path / "runs" / "split")
    assert_same_iterations(a, b, rel=1e-6)
    assert weights_gap(a, b) == 0.0


def assert_same_iterations(a: RunDir, b: RunDir, *, rel: float) -> None:
    """Iterations 0 and 1 of two runs sampled the same tokens and logged the same metrics (clocks excepted)."""
    for k in (0, 1):
        ra = pd.read_parquet(a.iteration(k) / "rollouts.parquet")
        rb = pd.read_parquet(b.iteration(k) / "rollouts.parquet")
        assert [list(x) for x in ra["input_ids"]] == [list(x) for x in rb["input_ids"]], k
        ma = json.loads((a.iteration(k) / "metrics.json").read_text())
        mb = json.loads((b.iteration(k) / "metrics.json").read_text())
        assert set(ma) == set(mb)
        # every metric but the clocks and the speeds they give
        differ = {key: (ma[key], mb[key]) for key in ma if not key.startswith("timing_s/")
                  and not key.endswith("tokens_per_s")
                  and ma[key] != pytest.approx(mb[key], rel=rel, abs=1e-6, nan_ok=True)}
        assert not differ, (k, differ)


def weights_gap(a: RunDir, b: RunDir) -> float:
    """The largest difference between two runs' actor weights after iteration 1."""
    wa = load_file(str(a.state(1) / "actor" / "model.safetensors"))
    wb = load_file(str(b.state(1) / "actor" / "model.safetensors"))
    return max(float((wa[n] - wb[n]).abs().max()) for n in wa)


def test_a_collapse_guard_rollback_builds_every_ranks_engine_again(tmp_path, prefect_api):
    """The guard trips at iteration 1 (a signal that is always on), rolls back to the base model and reopens the
    run: every rank closes its engine and builds a new one over the launch's process group, which must outlive
    the first; the run goes on, trips again and stops, and the launcher names rank 0 as the one that failed."""
    r = launch(tmp_path, prefect_api, 3, "--no-prefect", run="g", extra=(*VLLM, *ALWAYS_TRIPS))
    assert r.returncode != 0
    assert "tripped at iteration 1 (std_collapse) after 1 rollback(s) (iterations 1->0)" in r.stderr, r.stderr[-4000:]
    assert "rank 1: rank 0 stopped with an error" in r.stderr
    cause = r.stderr[r.stderr.index("Root Cause"):]
    assert re.search(r"rank\s+: 0 \(local_rank: 0\)\n\s+exitcode\s+: [1-9]", cause), cause
    run = RunDir(tmp_path / "runs" / "g")
    (event,) = json.loads((run.root / "guard.json").read_text())["rollbacks"]
    assert (event["at"], event["to"]) == (1, -1)
    # after the rollback, the rebuilt engines sampled iterations 0 and 1 again; iteration 0 from the same base
    # weights with the same seeds, so the same tokens on both ranks' new engines as on their first ones
    before = pd.read_parquet(run.root / "guard" / "rollback-1" / "iter_00000" / "rollouts.parquet")
    again = pd.read_parquet(run.iteration(0) / "rollouts.parquet")
    assert [list(x) for x in again["input_ids"]] == [list(x) for x in before["input_ids"]]
    assert len(pd.read_parquet(run.iteration(1) / "rollouts.parquet")) == 8

