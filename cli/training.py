"""`ragen train`, `ragen up`, `ragen rollout`: training runs, the deployed pipeline, one rollout collection."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from cli.common import (
    ParamsOpt,
    PresetOpt,
    SetOpt,
    config_or_exit,
    experiment_or_exit,
    fail,
    iteration_progress,
    sigterm_as_interrupt,
)


def train_cmd(run: Annotated[str, typer.Option("--run", "--run-name",
                                               help="run name: runs/<name>; an existing run continues; 'auto' = "
                                                    "named after the config's hash (--run-name under torchrun, "
                                                    "whose own options make --run ambiguous)")] = "default",
              iterations: Annotated[int | None, typer.Option(help="total iterations (trainer.total_training_steps)")]
              = None,
              params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None,
              prefect: Annotated[bool, typer.Option("--prefect/--no-prefect",
                                                    help="run as the Prefect flow `ragen` (in-process, no server "
                                                         "needed) or as plain calls")] = True,
              summary: Annotated[Path | None, typer.Option(help="write the run's final metrics here as JSON (the "
                                                                "dvc.yaml train stage's metrics file)")] = None,
              experiment: Annotated[str | None, typer.Option(help="a named experiment of the ablation grid "
                                                             "(`ragen experiments list`): its scale preset, presets "
                                                             "and overrides replace --params; --set comes last")]
              = None,
              scale: Annotated[str, typer.Option(help="the experiment's scale: cpu-small | paper")] = "cpu-small",
              seed: Annotated[int, typer.Option(help="the experiment's trainer.seed")] = 0,
              sweep: Annotated[str | None, typer.Option(help="MLflow parent run the experiment's run is a child "
                                                        "of")] = None,
              ) -> None:
    """Train (or continue) a run: rollouts -> update -> eval per iteration, each iteration saved under runs/.
    Under `torchrun` / `deepspeed` every rank runs this same command: rank 0 runs the loop, the others hold their
    share of the update."""
    from ragen.run.loop import with_iterations
    from ragen.train.ranks import launched, launcher_rank

    if launched() and launcher_rank() != 0:
        _follow()
    if experiment is not None:
        r = experiment_or_exit(experiment, scale, seed, overrides, sweep)
        params, preset, overrides = None, list(r.presets), list(r.overrides)
        run = r.run_name if run == "default" else run
    cfg = config_or_exit(params, preset, with_iterations(overrides, iterations))
    run = _run_name(cfg, run)
    with training_errors(cfg.trainer.run_dir, run, prefect):
        done, last, root = _train(cfg, run, prefect, params, preset, overrides, iterations)
    if summary is not None:
        _write_summary(Path(root), summary)
    _report(cfg, done, last, root)


def _run_name(cfg, run: str) -> str:
    """``--run`` checked; ``auto``: named after the config's hash (dvc repro after a params.yaml edit: a new run,
    not a refused restart of the old one)."""
    from ragen.run.rundir import RunDir

    if run == "auto":
        from ragen.run.identity import config_name

        run = config_name(cfg)
    try:
        RunDir.at(cfg.trainer.run_dir, run)
    except ValueError as e:
        fail(f"--run: {e}")
    return run


def _train(cfg, run: str, prefect: bool, params: Path | None, preset: list[str] | None,
           overrides: list[str] | None, iterations: int | None) -> tuple[list[int], dict | None, str]:
    """The run trained: as the Prefect flow (in-process) or as plain calls. Returns (iterations done now, the
    last one's metrics, the run's folder). A line per iteration on stderr: the flow's own log goes to Prefect,
    the plain loop prints nothing."""
    from ragen.train.ranks import leading

    with leading(), sigterm_as_interrupt(), iteration_progress(Path(cfg.trainer.run_dir) / run,
                                                               cfg.trainer.total_training_steps):
        if prefect:
            from flows.train_loop import train_loop

            out = train_loop(run_name=run, params=str(params) if params else None, preset=preset or [],
                             overrides=overrides or [], iterations=iterations)
            return out["iterations"], out["last_metrics"], out["run_dir"]
        from ragen.run.loop import run_training

        res = run_training(cfg, run)
        return res.iterations, (res.metrics[res.iterations[-1]] if res.iterations else None), str(res.run.root)


@contextlib.contextmanager
def training_errors(run_dir: str, run: str, prefect: bool) -> Iterator[None]:
    """What ends a training run, as exit codes: a refused start or a run that cannot go on (2, the message), Ctrl-C
    or SIGTERM (130, what is kept), a full disk or a read-only run folder (1, the completed data is intact)."""
    from ragen.run.disk import DiskTooSmall
    from ragen.run.guard import GuardGaveUp
    from ragen.run.rundir import ResumeError, RunDir
    from ragen.train.ranks import LaunchError

    refused: tuple[type[Exception], ...] = (ResumeError, GuardGaveUp, FileNotFoundError, LaunchError, DiskTooSmall)
    if prefect:
        from tasks.versioning import VersioningError

        refused = (*refused, VersioningError)
    try:
        yield
    except refused as e:
        fail(str(e))
    except KeyboardInterrupt:
        _stopped(run_dir, run)
    except Exception as e:
        from ragen.run.storage import storage_failure

        if prefect:
            from flows.train_loop import stopped_from_outside

            if stopped_from_outside(e):  # the interrupt, replaced by Prefect's error on its way out
                _stopped(run_dir, run)
        msg = storage_failure(RunDir.at(run_dir, run), e)
        if msg is None:
            raise
        fail(msg, 1)


def _report(cfg, done: list[int], last: dict | None, root: str) -> None:
    if not done:
        typer.echo(f"run {root} is already complete ({cfg.trainer.total_training_steps} iterations)")
        return
    from ragen.run.guard import GuardState
    from ragen.run.rundir import RunDir

    rolled = len(GuardState.read(RunDir(Path(root))).rollbacks)
    typer.echo(f"run {root}: completed iterations {done[0]}..{done[-1]}"
               + (f" (collapse guard: {rolled} rollback(s), see guard.json)" if rolled else ""))
    for k in ("val/score", "actor/grad_norm", "timing_s/iteration"):
        if last and k in last:
            typer.echo(f"  {k:24s} {last[k]:.4f}")


def _follow() -> NoReturn:
    """A rank other than 0 of a launch: its share of each trainer call rank 0 makes, until rank 0 is done."""
    from ragen.train.ranks import follow, launcher_rank

    if not follow():
        # exit 0: this rank's part ended cleanly, and a failure here would be the launcher's "root cause" (and
        # have it stop rank 0 while rank 0 still reports its own error)
        typer.echo(f"rank {launcher_rank()}: rank 0 stopped with an error (its output says which)", err=True)
    raise typer.Exit(0)


def _stopped(run_dir: str, run: str) -> NoReturn:
    from ragen.run.rundir import RunDir

    done = RunDir.at(run_dir, run).completed()
    fail(f"stopped (SIGTERM or Ctrl-C): iterations {f'0..{done[-1]}' if done else 'none'} of run "
         f"{Path(run_dir) / run} are complete and kept; the same command resumes it", 130)


def _write_summary(root: Path, out: Path) -> None:
    """The last completed iteration's metrics (and its evaluation) of a run, as one flat JSON object."""
    from ragen.run.rundir import RunDir

    run = RunDir(root)
    done = run.completed()
    data: dict[str, object] = {"run_dir": str(root), "iterations": len(done)}
    if done:
        data.update(json.loads((run.iteration(done[-1]) / "metrics.json").read_text()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")



def up_cmd(run: Annotated[str, typer.Option("--run", help="run name: runs/<name>; an existing run continues")]
           = "default",
           iterations: Annotated[int | None, typer.Option(help="total iterations (trainer.total_training_steps)")]
           = None,
           params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None,
           port: Annotated[int, typer.Option(help="Prefect server port on 127.0.0.1")] = 4200,
           keep: Annotated[bool, typer.Option("--keep/--stop", help="keep the server and deployment up after the "
                                                                   "run (Ctrl-C stops them)")] = False,
           trigger: Annotated[bool, typer.Option("--trigger/--no-trigger", help="trigger a training run (else only "
                                                                              "serve: implies --keep)")] = True,
           mode: Annotated[str, typer.Option(help="pool: deploy infra/prefect/prefect.yaml to the process work "
                                                  "pool ragen-process and start its worker; serve: flow.serve")]
           = "pool",
           ) -> None:
    """The pipeline as deployed: start a local Prefect server (sqlite), deploy `ragen/train-loop` to the local
    process work pool with a worker (or serve it), trigger one training run with `prefect deployment run`, wait for
    it, report."""
    from flows.serve import DEPLOYMENT, MODES, LocalPrefect
    from ragen.run.loop import with_iterations

    if mode not in MODES:
        fail(f"--mode {mode!r}: use one of {', '.join(MODES)}")
    if params is None and Path("params.yaml").is_file():
        params = Path("params.yaml")  # the flow's default too
    cfg = config_or_exit(params, preset, with_iterations(overrides, iterations))  # fails here, before any server starts
    from ragen.run.rundir import RunDir

    try:
        run_dir = RunDir.at(cfg.trainer.run_dir, run).root
    except ValueError as e:
        fail(f"--run: {e}")
    flow_params = {"run_name": run, "params": str(params) if params else None, "preset": preset or [],
                   "overrides": overrides or [], "iterations": iterations}
    t0 = time.monotonic()
    with sigterm_as_interrupt(), LocalPrefect(port=port, mode=mode) as local:  # `kill` stops it all like Ctrl-C
        how = "process work pool ragen-process and its worker" if mode == "pool" else "flow.serve"
        typer.echo(f"Prefect server on http://127.0.0.1:{port} (UI and API), {DEPLOYMENT} on the {how}; logs in "
                   f"runs/prefect/; training run {run!r} ({cfg.trainer.total_training_steps} iterations)")
        if trigger:
            typer.echo(f"triggering: prefect deployment run {DEPLOYMENT} --params '{json.dumps(flow_params)}' --watch")
            from ragen.sft.pipeline import needs_build

            warm = Path(cfg.sft.output) if needs_build(cfg) else None  # made first by the flow: its steps shown too
            first = "the warm-start (SFT) is made first: a line per few of its steps, then " if warm else "a "
            typer.echo(f"follow it in the Prefect UI: http://127.0.0.1:{port}/runs; {first}line per iteration below")
            with iteration_progress(run_dir, cfg.trainer.total_training_steps, warm_start=warm):
                r = local.run(flow_params)
            typer.echo(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip())
            typer.echo(f"wall time {time.monotonic() - t0:.0f} s; MLflow: `make mlflow-ui`, then "
                       f"http://127.0.0.1:5000")
            if r.returncode != 0:
                fail(f"the flow run did not complete:\n{r.stdout[-2000:]}{r.stderr[-2000:]}", 1)
        if keep or not trigger:
            typer.echo("serving until Ctrl-C")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass



def rollout_cmd(out: Annotated[Path, typer.Option(help="rollouts parquet file to write")],
                mode: Annotated[str, typer.Option(help="train or val")] = "train",
                iteration: Annotated[int, typer.Option(help="training iteration (train mode)")] = 0,
                engine: Annotated[str | None, typer.Option(help="vllm or hf (default: rollout.engine)")] = None,
                params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None,
                as_json: Annotated[bool, typer.Option("--json", help="print metrics as one JSON object")] = False,
                ) -> None:
    """Collect one iteration's rollouts standalone with the configured engine and base model; print metrics."""
    from ragen.agent.chat import ChatRenderer
    from ragen.models import load_tokenizer
    from ragen.rollout.factory import make_engine
    from ragen.rollout.runner import collect
    from ragen.rollout.table import write_rollouts

    if mode not in ("train", "val"):
        fail(f"--mode must be train or val, got {mode!r}")
    cfg = config_or_exit(params, preset or ["cpu-small"], overrides)
    tok = load_tokenizer(cfg.model.base, cfg.model.tokenizer, cfg.model.trust_remote_code)
    renderer = ChatRenderer(tok, cfg.model.end_of_turn_token)
    try:
        eng = make_engine(cfg, tok, engine=engine)
    except (FileNotFoundError, ImportError, ValueError) as e:
        fail(str(e), 1)
    try:
        c = collect(cfg, eng, renderer, mode=mode, iteration=iteration)
    finally:
        eng.close()
    write_rollouts(c.rollouts, out)
    if as_json:
        typer.echo(json.dumps(c.metrics))
    else:
        for k, v in c.metrics.items():
            if "non-zero" not in k:
                typer.echo(f"{k:40s} {v:12.4f}")
        typer.echo(f"wrote {len(c.rollouts)} trajectories to {out}")
