"""Deployments ``ragen/train-loop`` and ``ragen-sft/sft`` on a local Prefect server.

The default (``mode="pool"``, ``ragen up``): the process work pool ``ragen-process``, the deployment of
infra/prefect/prefect.yaml (the same file deploys to the Docker and Kubernetes pools), and one process worker with
``--limit 1`` (one heavy training run at a time on this machine; later triggers queue; each run is a fresh
subprocess, so a vLLM/DeepSpeed run never shares memory with the next). ``mode="serve"`` (``ragen up --mode
serve``): one long-lived process registers both deployments with ``flow.serve`` and executes their runs, with no
pool or worker; ``python -m flows.serve`` is that process.

``LocalPrefect`` starts ``prefect server start`` (sqlite under PREFECT_HOME, bound to 127.0.0.1) and the pool's
worker or the serving process, and stops them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers.local import Service, healthy, prefect_home_env

DEPLOYMENT = "ragen/train-loop"
PROCESS_POOL = "ragen-process"
POLL_SECONDS = 2  # how often the local worker (or serving process) asks the server for triggered runs
PREFECT_FILE = "infra/prefect/prefect.yaml"  # the work-pool deployments (process, Docker, Kubernetes)
MODES = ("pool", "serve")
_LAUNCHER_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def _bin(name: str) -> str:
    """A console script of this environment (prefect, dvc, mlflow), next to the running interpreter."""
    p = Path(sys.executable).with_name(name)
    return str(p) if p.exists() else name


@dataclass
class LocalPrefect(Service):
    """A local Prefect server and what runs ``ragen/train-loop``: a process work pool with a worker (``mode="pool"``:
    the deployment of infra/prefect/prefect.yaml) or the process serving it (``mode="serve"``: flow.serve);
    ``with LocalPrefect(...) as p:``."""

    port: int = 4200
    mode: str = "pool"
    home: Path | None = None  # PREFECT_HOME (its sqlite database); default: the user's ~/.prefect
    cwd: Path = field(default_factory=Path.cwd)  # where flow runs execute (the project root)
    logs: Path | None = None  # server.log and serve.log here; default: <cwd>/runs/prefect
    startup_timeout: float = 180.0
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def env(self) -> dict[str, str]:
        # a served run is its own 1-process job: a caller's torch.distributed variables (its MASTER_PORT is in
        # use by the caller) must not leak into it
        env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
        env.update(PREFECT_API_URL=self.api_url, PREFECT_SERVER_ANALYTICS_ENABLED="false",
                   PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_SERVER_API_PORT=str(self.port))
        # a triggered run starts within ~2 s instead of Prefect's 10 s between polls (a local sqlite server: the
        # queries cost nothing); the caller's own settings win
        env.setdefault("PREFECT_WORKER_QUERY_SECONDS", str(POLL_SECONDS))
        env.setdefault("PREFECT_RUNNER_POLL_FREQUENCY", str(POLL_SECONDS))
        if self.home is not None:
            env.update(prefect_home_env(self.home))
        return env

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        logs = self.logs or self.cwd / "runs" / "prefect"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / log).open("ab") as out:  # the child keeps its own copy of the descriptor
            p = subprocess.Popen(args, cwd=self.cwd, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)  # own process group: stop() takes its children too
        self.procs.append(p)
        return p

    def _wait(self, ready: Any, what: str, proc: subprocess.Popen, log: str) -> None:
        t0 = time.monotonic()
        while not ready():
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with code {proc.returncode}; see {self._log(log)}")
            if time.monotonic() - t0 > self.startup_timeout:
                raise TimeoutError(f"{what} not ready after {self.startup_timeout:.0f} s; see {self._log(log)}")
            time.sleep(1.0)

    def _log(self, name: str) -> Path:
        return (self.logs or self.cwd / "runs" / "prefect") / name

    def start(self) -> LocalPrefect:
        if healthy(self.api_url):
            raise RuntimeError(f"a Prefect server already answers on {self.api_url}: stop it or choose --port")
        if self.mode not in MODES:
            raise ValueError(f"LocalPrefect.mode={self.mode!r}; use one of {', '.join(MODES)}")
        self._start_server()
        for name in self.crash_orphans():
            print(f"Prefect: flow run {name!r} was left Running by a server or worker that died; its process is "
                  f"gone, so it is marked Crashed (a new trigger of the run resumes it)", file=sys.stderr)
        if self.mode == "serve":
            serve = self._spawn([sys.executable, "-m", "flows.serve"], "serve.log")
            self._wait(self.deployment_ready, f"the process serving {DEPLOYMENT}", serve, "serve.log")
        else:
            self._prefect(["work-pool", "create", PROCESS_POOL, "--type", "process", "--overwrite"], "create the pool")
            self._prefect(["--no-prompt", "deploy", "--prefect-file", PREFECT_FILE, "--name", "train-loop",
                           "--name", "sft"], f"deploy {DEPLOYMENT} and ragen-sft/sft from {PREFECT_FILE}")
            # one run at a time on this machine, as the served deployment's limit=1
            worker = self._spawn([_bin("prefect"), "worker", "start", "--pool", PROCESS_POOL, "--type", "process",
                                  "--limit", "1"], "worker.log")
            self._wait(self.worker_ready, f"the {PROCESS_POOL} worker", worker, "worker.log")
        return self

    def _start_server(self) -> subprocess.Popen:
        server = self._spawn([_bin("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port),
                              "--analytics-off"], "server.log")
        self._wait(lambda: healthy(self.api_url), "the Prefect server", server, "server.log")
        return server

    def restart_server(self) -> None:
        """The API server again, alone, on the same port and home after it died (the worker and the serving
        process stay): the worker and a flow run in progress reconnect, as Prefect's client retries a lost
        connection for about a minute (PREFECT_CLIENT_MAX_RETRIES, 2 s doubling). Orphans are not swept here:
        the runs in progress still live."""
        dead = self.procs[0]
        if dead.poll() is None:
            raise RuntimeError(f"the Prefect server (pid {dead.pid}) still runs: nothing to restart")
        _killpg(dead.pid, signal.SIGKILL)  # what of its process group survived it still holds the port
        server = self._start_server()
        self.procs.remove(server)  # _spawn appended it: it takes the dead one's place (first, so stopped last)
        self.procs[0] = server

    def crash_orphans(self) -> list[str]:
        """Mark Crashed the flow runs this server still shows Running, Pending or Cancelling although nothing
        executes them any more: deployment runs whose process is gone (the server or the worker was killed under
        them, so nobody reported the end) and the subflows of runs that are over. Left as they are, a dead run keeps
        its deployment's concurrency slot (``concurrency_limit: 1``): every later run would wait for it for ever.
        Called before any worker starts; a run whose process still lives is left alone. Returns their names."""
        from prefect.client.orchestration import SyncPrefectClient
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
        from prefect.client.schemas.objects import StateType
        from prefect.states import Crashed

        live = [StateType.RUNNING, StateType.PENDING, StateType.CANCELLING]
        crashed: dict[Any, str] = {}  # id -> name (names repeat: every run has its iteration-1 subflow)
        with SyncPrefectClient(self.api_url) as client:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=live))))

            def crash(run: Any, why: str) -> None:
                client.set_flow_run_state(run.id, Crashed(message=why), force=True)
                crashed[run.id] = run.name

            for run in runs:
                if run.deployment_id is not None and not _alive(run.infrastructure_pid):
                    crash(run, f"its process ({run.infrastructure_pid or 'never started'}) is gone: the Prefect "
                               f"server or worker stopped under it")
            for run in runs:
                if run.parent_task_run_id is not None and run.id not in crashed:
                    parent = client.read_flow_run(client.read_task_run(run.parent_task_run_id).flow_run_id)
                    if parent.state is None or parent.state.type not in live:
                        crash(run, f"its parent flow run {parent.name!r} is over")
        return list(crashed.values())

    @property
    def main_log(self) -> str:
        """The log of what executes the runs (the worker's or the serving process's)."""
        return "worker.log" if self.mode == "pool" else "serve.log"

    def _prefect(self, args: list[str], what: str) -> None:
        r = subprocess.run([_bin("prefect"), *args], env=dict(self.env(), RAGEN_ROOT=str(Path(self.cwd).resolve())),
                           cwd=self.cwd, capture_output=True, text=True, timeout=300)
        if r.returncode:
            raise RuntimeError(f"could not {what} (`prefect {' '.join(args)}` exit {r.returncode}):\n"
                               f"{(r.stdout + r.stderr)[-3000:]}")

    def worker_ready(self) -> bool:
        r = subprocess.run([_bin("prefect"), "work-pool", "inspect", PROCESS_POOL], env=self.env(), cwd=self.cwd,
                           capture_output=True, text=True, timeout=60)
        # the pool turns READY once a worker has polled it
        return r.returncode == 0 and "status=WorkPoolStatus.READY" in r.stdout.replace("'", "").replace(" ", "")

    def deployment_ready(self) -> bool:
        r = subprocess.run([_bin("prefect"), "deployment", "inspect", DEPLOYMENT], env=self.env(), cwd=self.cwd,
                           capture_output=True, text=True, timeout=60)
        return r.returncode == 0

    def run(self, params: dict[str, Any], timeout: float | None = None) -> subprocess.CompletedProcess:
        """``prefect deployment run ragen/train-loop --params ... --watch``: returns when the run is terminal, or
        raises if the server or the serving process dies meanwhile (the run would wait for ever)."""
        args = [_bin("prefect"), "deployment", "run", DEPLOYMENT, "--params", json.dumps(params), "--watch"]
        if timeout is not None:
            args += ["--watch-timeout", str(int(timeout))]
        with subprocess.Popen(args, env=self.env(), cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as watch:
            while True:
                try:
                    out, err = watch.communicate(timeout=5)
                    return subprocess.CompletedProcess(args, watch.returncode, out, err)
                except subprocess.TimeoutExpired:
                    dead = [p for p in self.procs if p.poll() is not None]
                    if dead:
                        watch.kill()
                        raise RuntimeError(f"{' '.join(dead[0].args[:3])} exited (code {dead[0].returncode}) "
                                           f"while the run was in progress; see {self._log(self.main_log)}") from None

    def stop(self) -> None:
        """SIGTERM to each process group (also when its leader is gone: its children keep the port), SIGKILL to
        what is still there after 30 s."""
        for p in reversed(self.procs):
            _killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
            _killpg(p.pid, signal.SIGKILL)
            p.wait()
        self.procs.clear()


def _alive(pid: str | None) -> bool:
    """Whether the process a worker recorded for a flow run (``infrastructure_pid``) still runs here."""
    if not pid or not pid.isdigit():
        return False
    if not Path("/proc/self").is_dir():  # no procfs (macOS): a signal 0 says whether the pid exists
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent has not collected it


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def deployments() -> list[Any]:
    """What ``ragen serve`` deploys: each flow is gated (flows/trust.py), its parameters checked before any file
    is parsed; tests/test_trust.py fails on a deployment that skips the gate."""
    from flows.sft import sft_flow
    from flows.train_loop import train_loop

    # parameters default to the flows': params.yaml of the working directory, run "default"
    return [train_loop.to_deployment(name="train-loop", description="StarPO(-S) training run (one subflow per "
                                     "iteration)", tags=["ragen"]),
            sft_flow.to_deployment(name="sft", description="SFT warm-start: demos -> SFT -> format evaluation",
                                   tags=["ragen"])]


def main() -> None:
    from prefect import serve

    # one run at a time across the deployments (each holds a rollout engine and a trainer)
    serve(*deployments(), limit=1, print_starting_message=True)


if __name__ == "__main__":
    main()
