"""What every command group shares: the config options, resolving them with a clear exit, the error exit, JSON
output."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ragen.config import ConfigError, load_config

PresetOpt = Annotated[list[str] | None, typer.Option("--preset", "-p", help="preset name(s), applied in order")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="override key.sub=value (repeatable)")]
ParamsOpt = Annotated[Path | None, typer.Option("--params", help="params YAML file (e.g. params.yaml)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object")]


def fail(message: str, code: int = 2) -> NoReturn:
    """Stop the command: the message in red on stderr and exit ``code`` (2: bad input, 1: the work failed)."""
    typer.secho(message, err=True, fg="red")
    raise typer.Exit(code)


def config_or_exit(params: Path | None, preset: list[str] | None, overrides: list[str] | None):
    try:
        return load_config(params, preset or [], overrides or [])
    except ConfigError as e:
        fail(f"config error:\n{e}")


def experiment_or_exit(name: str, scale: str, seed: int, overrides: list[str] | None, sweep: str | None = None):
    """A named experiment resolved at a scale; an unknown name or scale exits 2 with the known ones."""
    from ragen.experiments import experiment_settings

    try:
        return experiment_settings(name, scale, seed, overrides or [], sweep)
    except KeyError as e:
        fail(str(e.args[0]))


def print_panel(m: dict) -> None:
    tags = [k[: -len("/success")] for k in m if k.endswith("/success") and not k.startswith("all/")]
    typer.echo(f"{'tag':28s} {'success [95% CI]':24s} {'reward':>8s} {'resp len':>9s} {'format err':>10s}")
    for t in tags:
        typer.echo(f"{t:28s} {m[f'{t}/success']:6.3f} [{m[f'{t}/success_lo']:.3f}, {m[f'{t}/success_hi']:.3f}]"
                   f"{'':3s} {m[f'{t}/reward']:8.3f} {m[f'{t}/response_length']:9.1f} "
                   f"{m[f'{t}/format_error_rate']:10.3f}")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """`kill <pid>` stops the work in hand like Ctrl-C: it unwinds (the iteration in progress is abandoned, the
    completed ones stay, the MLflow run is marked KILLED, engines shut down) instead of the process vanishing."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def stdout_to_stderr():
    """Everything the libraries print while a benchmark runs (vLLM's log, DeepSpeed's op builds, C-level writes)
    goes to stderr, so that the command's stdout is its result alone (one JSON line with --json)."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    sys.stdout.flush()
    saved, real = os.dup(1), sys.stdout
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        sys.stdout = real


def print_result(result: dict, as_json: bool) -> None:
    """A benchmark's result as one JSON object, or as an aligned key/value table."""
    if as_json:
        typer.echo(json.dumps(result))
        return
    def rows(d: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
        for k, v in d.items():
            yield from rows(v, f"{prefix}{k}/") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    for k, v in rows(result):
        typer.echo(f"{k:40s} {v:>12.3f}" if isinstance(v, float) else f"{k:40s} {v!s:>12}")


@contextlib.contextmanager
def iteration_progress(run_dir: Path, total: int, every_s: float = 5.0, warm_start: Path | None = None
                       ) -> Iterator[None]:
    """While the body trains ``run_dir`` (in this process or another), print a line per completed iteration on
    stderr (success, format errors, seconds, time left), read from the run directory every few seconds; and,
    given the warm-start's output folder (``sft.output``) while it is made first, a line per SFT step reported
    (its progress file, ``ragen.sft.pipeline.progress_file``)."""
    import json
    import threading

    from ragen.run.progress import RunWatcher
    from ragen.run.rundir import RunDir
    from ragen.sft.pipeline import progress_file, progress_line

    watcher, stop, t0 = RunWatcher(RunDir(run_dir), total), threading.Event(), time.monotonic()
    sft_at, sft_seen = (progress_file(warm_start) if warm_start is not None else None), [-1]

    def report() -> None:
        if sft_at is not None:
            try:
                sft = json.loads(sft_at.read_text())
            except (OSError, ValueError):  # not started, finished (removed), or being replaced
                sft = None
            if sft is not None and sft["step"] != sft_seen[0]:
                sft_seen[0] = sft["step"]
                typer.echo(f"  {progress_line(sft)}", err=True)
        for line in watcher.new_lines():
            typer.echo(f"  {line}, {time.monotonic() - t0:.0f} s in all", err=True)

    def loop() -> None:
        while not stop.wait(every_s):
            report()

    thread = threading.Thread(target=loop, name="iteration-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        report()
