"""One rank of a 2-rank launch (`torchrun --nproc_per_node 2 ragen train`, gloo, the tiny model) killed, then
another launch's rank hung, just before an update: the launch ends within a stated bound naming the rank, and
launched again the run resumes and ends as one process running both iterations does."""

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ledger import declares
from test_launcher import assert_same_iterations, launch, launch_command, weights_gap

from ragen.run.rundir import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def rank_pid(launcher_pid: int, rank: int) -> int | None:
    """The pid of a launched rank: the process below the launcher whose environment says RANK=<rank>."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env = proc.joinpath("environ").read_bytes().split(b"\0")
            stat = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and int(stat[1]) == launcher_pid and b"LOCAL_RANK=%d" % rank in env:
            return int(proc.name)
    return None


@declares("one rank of a 2-rank launch SIGKILLed before an update", "one rank of a 2-rank launch hung (SIGSTOP) "
          "before an update")
def test_a_killed_or_hung_rank_ends_the_launch_within_its_bound_and_a_relaunch_resumes(tmp_path, prefect_api,
                                                                                      one_process_run, fault):
    """Rank 1 of a 2-rank launch is SIGKILLed, then (another run) stopped with SIGSTOP, once iteration 1's
    rollouts are written (its update next): the launch exits within a bound, naming rank 1 (the launcher for a
    killed rank; rank 0's heartbeat watch for a hung one, train/watchdog.py), and launched again the run resumes
    and ends as one process running both iterations does."""
    one = one_process_run
    stale_s = 10
    faults = {"killed": fault("one rank of a 2-rank launch SIGKILLed before an update"),
              "hung": fault("one rank of a 2-rank launch hung (SIGSTOP) before an update")}
    for run, sig, bound_s, names in (("killed", signal.SIGKILL, 60, r"local_rank: 1\)\n\s+exitcode\s+: -9"),
                                     ("hung", signal.SIGSTOP, stale_s + 5 + 30 + 30,
                                      r"rank 0: rank 1 stopped answering \(no heartbeat for 1\d s")):
        cmd, env = launch_command(tmp_path, prefect_api, 2, "--no-prefect", run=run)
        env["RAGEN_RANK_STALE_S"] = str(stale_s)
        p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rollouts = tmp_path / "runs" / run / "iter_00001" / "rollouts.parquet"
        t0 = time.monotonic()
        while not rollouts.is_file():
            assert p.poll() is None, p.communicate()[1][-3000:]
            assert time.monotonic() - t0 < 300, "iteration 1's rollouts never appeared"
            time.sleep(0.01)
        pid = rank_pid(p.pid, 1)
        assert pid is not None
        faults[run].guard(tmp_path / "runs" / run)  # iteration 0, complete
        os.kill(pid, sig)
        hit = time.monotonic()
        try:
            _, err = p.communicate(timeout=bound_s + 60)
        finally:
            if sig == signal.SIGSTOP:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        took = time.monotonic() - hit
        assert p.returncode != 0 and took < bound_s, (run, took, err[-3000:])
        assert re.search(names, err), (run, err[-3000:])
        assert RunDir(tmp_path / "runs" / run).completed() == [0]
        assert faults[run].lost_now() == []  # before the relaunch
        again = launch(tmp_path, prefect_api, 2, "--no-prefect", run=run)
        assert again.returncode == 0, again.stderr[-4000:]
        assert "completed iterations 1..1" in again.stdout
        resumed = RunDir(tmp_path / "runs" / run)
        assert_same_iterations(one, resumed, rel=1e-4)
        assert weights_gap(one, resumed) < 1e-4
        assert faults[run].lost_now() == []
