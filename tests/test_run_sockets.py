"""What a one-process run listens on (tests/run_sockets.py runs it; tests/listening.py reads the kernel's tables)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_loop import TINY

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("engine", ["hf"])
def test_a_one_process_run_listens_on_loopback_only(tmp_path, engine):
    """Every TCP socket a one-process run holds open after an iteration (rollouts, update, evaluation) is bound
    to a loopback address: the process group's store is in memory, gloo listens on the loopback interface. With
    the HF engine the trainer makes the process group (the old all-interface store); with vLLM, vLLM makes it
    (loopback only: this test with `engine=vllm` passed on 2026-12-07 and is left out of the suite for its 73 s)."""

    over = [o for o in TINY if not o.startswith("rollout.engine=")]
    over += [f"rollout.engine={engine}", "tracking.dvc=false", "trainer.total_training_steps=1"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "GLOO_SOCKET_IFNAME")}
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("run_sockets.py")), str(tmp_path), *over],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    sockets = json.loads(out.stdout.strip().splitlines()[-1])
    assert sockets, "the run held no listening socket: the check saw nothing (gloo listens on one)"
    wide = [s for s in sockets if s.rsplit(":", 1)[0] not in ("127.0.0.1", "::1")]
    assert not wide, f"a one-process run listens beyond loopback: {wide}"
