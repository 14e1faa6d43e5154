"""`ragen ...` commands."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from ragen.config import ConfigError, config_to_dict, load_config

app = typer.Typer(no_args_is_help=True, add_completion=False, help="RAGEN / StarPO pipeline tools.")
envs_app = typer.Typer(no_args_is_help=True, help="Inspect environments and generate instances.")
bench_app = typer.Typer(no_args_is_help=True, help="Speed checks; print JSON.")
config_app = typer.Typer(no_args_is_help=True, help="Resolve and show configs.")
models_app = typer.Typer(no_args_is_help=True, help="Prepare and locate models.")
sft_app = typer.Typer(no_args_is_help=True, help="SFT warm-start on solver demonstrations.")
eval_app = typer.Typer(help="Score a checkpoint on a fixed seed panel (`ragen eval --checkpoint ... --panel ...`); "
                            "`ragen eval panel` makes a panel.")
experiments_app = typer.Typer(no_args_is_help=True, help="The paper's ablations as named experiments.")
grid_app = typer.Typer(no_args_is_help=True, help="The ablation grid of params.yaml's `experiments` block (what the "
                                                  "dvc.yaml ablation stages run).")
app.add_typer(envs_app, name="envs")
app.add_typer(bench_app, name="bench")
app.add_typer(config_app, name="config")
app.add_typer(models_app, name="models")
app.add_typer(sft_app, name="sft")
app.add_typer(eval_app, name="eval")
app.add_typer(experiments_app, name="experiments")
app.add_typer(grid_app, name="grid")
runs_app = typer.Typer(no_args_is_help=True, help="Training runs on disk (runs/<name>).")
app.add_typer(runs_app, name="runs")
services_app = typer.Typer(no_args_is_help=True, help="Local servers for tracking at scale (infra/mlflow/).")
app.add_typer(services_app, name="services")

PresetOpt = Annotated[list[str] | None, typer.Option("--preset", "-p", help="preset name(s), applied in order")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="override key.sub=value (repeatable)")]
ParamsOpt = Annotated[Path | None, typer.Option("--params", help="params YAML file (e.g. params.yaml)")]


def _config(params: Path | None, preset: list[str] | None, overrides: list[str] | None):
    try:
        return load_config(params, preset or [], overrides or [])
    except ConfigError as e:
        typer.secho(f"config error:\n{e}", err=True, fg="red")
        raise typer.Exit(2) from None


def _experiment(name: str, scale: str, seed: int, overrides: list[str] | None, sweep: str | None = None):
    """A named experiment resolved at a scale; an unknown name or scale exits 2 with the known ones."""
    from ragen.experiments import resolve

    try:
        return resolve(name, scale, seed, overrides or [], sweep)
    except KeyError as e:
        typer.secho(str(e.args[0]), err=True, fg="red")
        raise typer.Exit(2) from None


@config_app.command("show")
def config_show(params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Print the resolved config as YAML."""
    import yaml

    typer.echo(yaml.safe_dump(config_to_dict(_config(params, preset, overrides)), sort_keys=False,
                              allow_unicode=True))


@config_app.command("params")
def config_params(params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Print the resolved config as a commented params file (how params.yaml is generated)."""
    from ragen.config import PARAMS_HEADER, commented_yaml
    from ragen.experiments import grid_yaml

    typer.echo(commented_yaml(_config(params, preset, overrides), PARAMS_HEADER) + grid_yaml(), nl=False)


@config_app.command("reference")
def config_reference(write: Annotated[Path | None, typer.Option(help="refresh the generated block of this page "
                                                                     "(docs/configuration.md) in place")] = None,
                     ) -> None:
    """Print the key reference generated from the schema (key, type, default, description), or refresh a page's."""
    from ragen.config_reference import reference_markdown, write_reference

    if write is None:
        typer.echo(reference_markdown(), nl=False)
        return
    try:
        changed = write_reference(write)
    except (OSError, ValueError) as e:
        typer.secho(f"{write}: {e}", err=True, fg="red")
        raise typer.Exit(2) from None
    typer.echo(f"{write}: {'updated' if changed else 'already current'}")


@envs_app.command("list")
def envs_list() -> None:
    """List env tags with their env type and settings."""
    from ragen.envs import BUILTIN_TAGS

    for spec in BUILTIN_TAGS.values():
        typer.echo(f"{spec.tag:28s} {spec.env_id:22s} {dict(spec.env_kwargs)}")


@envs_app.command("show")
def envs_show(tag: Annotated[str, typer.Option(help="env tag, e.g. SimpleSokoban")] = "SimpleSokoban",
              seed: Annotated[int, typer.Option(help="instance seed")] = 123,
              params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None,
              state_only: Annotated[bool, typer.Option("--state-only", help="print only the grid")] = False,
              ) -> None:
    """Print the first-turn prompt exactly as the model sees it (chat template + forced prefix)."""
    from ragen.agent.chat import ChatRenderer
    from ragen.agent.episode import Episode
    from ragen.envs import get_tag
    from ragen.models import load_tokenizer

    cfg = _config(params, preset or ["cpu-small"], overrides)
    try:
        spec = get_tag(tag, cfg.tag_specs())
    except KeyError as e:
        typer.secho(str(e.args[0]), err=True, fg="red")
        raise typer.Exit(2) from None
    env = spec.make()
    if state_only:
        typer.echo(env.reset(seed=seed)[0])
        return
    tok = load_tokenizer(cfg.model.base, cfg.model.tokenizer, cfg.model.trust_remote_code)
    renderer = ChatRenderer(tok, cfg.model.end_of_turn_token)
    episode = Episode(env, spec, cfg.agent, renderer, seed=seed)
    typer.echo(tok.decode(episode.prompt_ids()))


@envs_app.command("instances")
def envs_instances(out: Annotated[Path, typer.Option(help="output parquet file")],
                   mode: Annotated[str, typer.Option(help="train or val")] = "train",
                   iteration: Annotated[int, typer.Option(help="training iteration (train mode)")] = 0,
                   params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Generate one iteration's env instances (the pipeline's first stage) and write them as parquet."""
    from ragen.envs.instances import write_instances
    from ragen.rollout.runner import instances_for

    if mode not in ("train", "val"):
        typer.secho(f"--mode must be train or val, got {mode!r}", err=True, fg="red")
        raise typer.Exit(2)
    cfg = _config(params, preset or ["cpu-small"], overrides)
    df = instances_for(cfg, mode, iteration)
    write_instances(df, out)
    summary = df.groupby("tag").agg(envs=("env_id", "size"), groups=("group", "nunique"),
                                    seeds=("seed", lambda s: f"{s.min()}..{s.max()}"),
                                    mean_optimal_length=("optimal_length", "mean"))
    typer.echo(summary.to_string())
    typer.echo(f"wrote {len(df)} instances to {out}")


@app.command("train")
def train_cmd(run: Annotated[str, typer.Option("--run", help="run name: runs/<name>; an existing run continues; "
                                                          "'auto' = named after the config's hash")] = "default",
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
    """Train (or continue) a run: rollouts -> update -> eval per iteration, each iteration saved under runs/."""
    from ragen.run.guard import GuardGaveUp
    from ragen.run.loop import with_iterations
    from ragen.run.rundir import ResumeError, RunDir

    if experiment is not None:
        r = _experiment(experiment, scale, seed, overrides, sweep)
        params, preset, overrides = None, list(r.presets), list(r.overrides)
        run = r.run_name if run == "default" else run
    cfg = _config(params, preset, with_iterations(overrides, iterations))
    if run == "auto":  # dvc repro after a params.yaml edit: a new run, not a refused restart of the old one
        from ragen.run.rundir import config_name

        run = config_name(cfg)
    try:
        RunDir.at(cfg.trainer.run_dir, run)
    except ValueError as e:
        typer.secho(f"--run: {e}", err=True, fg="red")
        raise typer.Exit(2) from None
    errors: tuple[type[Exception], ...] = (ResumeError, GuardGaveUp, FileNotFoundError)
    try:
        if prefect:
            from flows.train_loop import train_loop
            from tasks.versioning import VersioningError

            errors = (ResumeError, GuardGaveUp, VersioningError, FileNotFoundError)

            out = train_loop(run_name=run, params=str(params) if params else None, preset=preset or [],
                             overrides=overrides or [], iterations=iterations)
            done, last, root = out["iterations"], out["last_metrics"], out["run_dir"]
        else:
            from ragen.run.loop import train_loop as plain_loop

            res = plain_loop(cfg, run)
            done, root = res.iterations, res.run.root
            last = res.metrics[done[-1]] if done else None
    except errors as e:
        typer.secho(str(e), err=True, fg="red")
        raise typer.Exit(2) from None
    except Exception as e:  # a full disk, a quota, a read-only run directory: say so, the completed data is intact
        from ragen.run.rundir import storage_failure

        msg = storage_failure(RunDir.at(cfg.trainer.run_dir, run), e)
        if msg is None:
            raise
        typer.secho(msg, err=True, fg="red")
        raise typer.Exit(1) from None
    if summary is not None:
        _write_summary(Path(root), summary)
    if not done:
        typer.echo(f"run {root} is already complete ({cfg.trainer.total_training_steps} iterations)")
        return
    from ragen.run.guard import GuardState

    rolled = len(GuardState.read(RunDir(Path(root))).rollbacks)
    typer.echo(f"run {root}: completed iterations {done[0]}..{done[-1]}"
               + (f" (collapse guard: {rolled} rollback(s), see guard.json)" if rolled else ""))
    for k in ("val/score", "actor/grad_norm", "timing_s/iteration"):
        if last and k in last:
            typer.echo(f"  {k:24s} {last[k]:.4f}")


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


@app.command("up")
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
        typer.secho(f"--mode {mode!r}: use one of {', '.join(MODES)}", err=True, fg="red")
        raise typer.Exit(2)
    if params is None and Path("params.yaml").is_file():
        params = Path("params.yaml")  # the flow's default too
    cfg = _config(params, preset, with_iterations(overrides, iterations))  # fails here, before any server starts
    flow_params = {"run_name": run, "params": str(params) if params else None, "preset": preset or [],
                   "overrides": overrides or [], "iterations": iterations}
    import signal

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # `kill` stops the server, the serving process and its runs like Ctrl-C does

    signal.signal(signal.SIGTERM, stop)
    t0 = time.monotonic()
    with LocalPrefect(port=port, mode=mode) as local:
        how = "process work pool ragen-process and its worker" if mode == "pool" else "flow.serve"
        typer.echo(f"Prefect server on http://127.0.0.1:{port} (UI and API), {DEPLOYMENT} on the {how}; logs in "
                   f"runs/prefect/; training run {run!r} ({cfg.trainer.total_training_steps} iterations)")
        if trigger:
            typer.echo(f"triggering: prefect deployment run {DEPLOYMENT} --params '{json.dumps(flow_params)}' --watch")
            r = local.run(flow_params)
            typer.echo(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip())
            typer.echo(f"wall time {time.monotonic() - t0:.0f} s; MLflow: `make mlflow-ui`, then "
                       f"http://127.0.0.1:5000")
            if r.returncode != 0:
                typer.secho(f"the flow run did not complete:\n{r.stdout[-2000:]}{r.stderr[-2000:]}", err=True,
                            fg="red")
                raise typer.Exit(1)
        if keep or not trigger:
            typer.echo("serving until Ctrl-C")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass


@app.command("rollout")
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
        typer.secho(f"--mode must be train or val, got {mode!r}", err=True, fg="red")
        raise typer.Exit(2)
    cfg = _config(params, preset or ["cpu-small"], overrides)
    tok = load_tokenizer(cfg.model.base, cfg.model.tokenizer, cfg.model.trust_remote_code)
    renderer = ChatRenderer(tok, cfg.model.end_of_turn_token)
    try:
        eng = make_engine(cfg, tok, engine=engine)
    except (FileNotFoundError, ImportError, ValueError) as e:
        typer.secho(str(e), err=True, fg="red")
        raise typer.Exit(1) from None
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


def _sft_presets(params: Path | None, preset: list[str] | None) -> list[str]:
    """The `ragen sft` commands agree on the config (hence on the demos' fingerprint): the given presets, or
    cpu-small when neither a params file nor a preset is given."""
    return list(preset or ([] if params else ["cpu-small"]))


def _print_format(title: str, m: dict) -> None:
    typer.echo(title)
    for k, v in m.items():
        if k.endswith(("/format_valid", "/success", "/hi_arm_share", "format_valid_mean")):
            typer.echo(f"  {k:36s} {v:8.3f}")


@sft_app.command("train")
def sft_train_cmd(params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None,
                  evaluate: Annotated[bool, typer.Option("--eval/--no-eval", help="format evaluation of the base "
                                                         "model and of the result")] = True,
                  prefect: Annotated[bool, typer.Option("--prefect/--no-prefect", help="run as the Prefect flow "
                                                        "ragen-sft (then also DVC + MLflow) or as plain calls")]
                  = True,
                  version: Annotated[bool, typer.Option("--version/--no-version", help="DVC-add the demos and the "
                                                        "checkpoint (not needed under `dvc repro`)")] = True,
                  summary: Annotated[Path | None, typer.Option(help="write the stage metrics here as JSON")] = None,
                  experiment: Annotated[str | None, typer.Option(help="a named SFT experiment (ragen/experiments.py, "
                                                                 "e.g. sft-baseline): its presets and overrides "
                                                                 "come before --preset/--set")] = None,
                  ) -> None:
    """Demos -> SFT -> format evaluation; the checkpoint (sft.output) can be model.base or model.warm_start."""
    from ragen.sft.pipeline import run_sft

    if experiment is not None:
        from ragen.experiments import get_experiment

        try:
            e = get_experiment(experiment, "sft")
        except KeyError as err:
            typer.secho(str(err.args[0]), err=True, fg="red")
            raise typer.Exit(2) from None
        preset, overrides = [*e.presets, *(preset or [])], [*e.overrides, *(overrides or [])]
    preset = _sft_presets(params, preset)
    cfg = _config(params, preset, overrides)
    if prefect:
        from flows.sft import sft_flow

        res = sft_flow(str(params) if params else None, preset or [], overrides or [], evaluate, version)
    else:
        res = run_sft(cfg, evaluate=evaluate)
    for when in ("before", "after"):
        if when in res:
            _print_format(f"format with thinking, {when} SFT ({cfg.sft.eval_n} seeds per tag):", res[when])
    t = res["train"]
    typer.echo(f"SFT: {t['sft/steps']:.0f} steps, {t['sft/epochs']:.2f} epochs in {t['sft/time_s']:.0f} s, "
               f"loss {t['sft/train_loss_first']:.3f} -> {t['sft/train_loss_last']:.3f}; checkpoint "
               f"{res['checkpoint']} (use model.base={res['checkpoint']}/actor or model.warm_start=auto)")
    if summary is not None:
        summary.parent.mkdir(parents=True, exist_ok=True)
        flat = {f"{w}/{k}": v for w in ("before", "train", "after") for k, v in (res.get(w) or {}).items()
                if isinstance(v, int | float)}
        summary.write_text(json.dumps(flat, indent=2, sort_keys=True) + "\n")


@sft_app.command("demos")
def sft_demos_cmd(params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None,
                  out: Annotated[Path | None, typer.Option(help="parquet file (default: sft.demos)")] = None,
                  ) -> None:
    """Make the solver demonstrations (train and test splits) as a parquet table."""
    from ragen.sft.pipeline import make_demos_stage

    cfg = _config(params, _sft_presets(params, preset), overrides)
    path = make_demos_stage(cfg, out, progress=True)
    typer.echo(path.with_suffix(".json").read_text())
    typer.echo(f"wrote {path}")


@sft_app.command("eval")
def sft_eval_cmd(out: Annotated[Path, typer.Option(help="metrics JSON to write")],
                 model: Annotated[str | None, typer.Option(help="model directory (default: model.base)")] = None,
                 params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Format evaluation with thinking on the fixed SFT evaluation seeds (sft.eval_n per tag)."""
    from ragen.sft.pipeline import evaluate_stage

    cfg = _config(params, _sft_presets(params, preset), overrides)
    _print_format(f"format of {model or cfg.model.base}:", evaluate_stage(cfg, model, out))


@eval_app.callback(invoke_without_command=True)
def eval_cmd(ctx: typer.Context,
             checkpoint: Annotated[str | None, typer.Option(help="model dir, checkpoint dir (actor/) or run dir "
                                                            "(its last retained checkpoint)")] = None,
             mlflow_model: Annotated[str | None, typer.Option(help="registered model, NAME@ALIAS (e.g. "
                                                              "ragen-actor@champion) or NAME/VERSION")] = None,
             panel: Annotated[Path | None, typer.Option(help="seed panel file (default: eval.panel)")] = None,
             tags: Annotated[list[str] | None, typer.Option("--tag", help="panel tags to score (repeatable; "
                                                            "default: eval.tags or all)")] = None,
             out: Annotated[Path | None, typer.Option(help="output directory (eval.json + rollouts.parquet)")]
             = None,
             greedy: Annotated[bool, typer.Option("--greedy/--sample", help="argmax decoding instead of the "
                                                  "validation temperature (0.5)")] = False,
             samples: Annotated[int | None, typer.Option(help="rollouts per seed (eval.pass_k): pass@k")] = None,
             best: Annotated[bool, typer.Option("--best/--last", help="for a run dir: its best-scored checkpoint "
                                                "instead of the last")] = False,
             log: Annotated[bool, typer.Option("--mlflow/--no-mlflow", help="log the scores to MLflow")] = True,
             params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Score a model on a fixed seed panel: success, pass@k, reward, response length, format errors with 95% CIs.
    The agent settings (turns, actions per turn, thinking) come from the config, or from a run directory's own
    config.yaml when --checkpoint is a run and neither --params nor --preset is given."""
    if ctx.invoked_subcommand is not None:
        return
    from ragen.eval.evaluate import resolve_checkpoint

    over = [*(overrides or [])]
    if checkpoint is not None and params is None and not preset and (Path(checkpoint) / "config.yaml").is_file():
        params = Path(checkpoint) / "config.yaml"  # score a run with the settings it trained with
    if panel is not None:
        over.append(f"eval.panel={panel}")
    if tags:
        over.append(f"eval.tags=[{','.join(tags)}]")
    if samples is not None:
        over.append(f"eval.pass_k={samples}")
    cfg = _config(params, preset, over)
    if cfg.eval.panel is None:
        typer.secho("no panel: give --panel FILE (make one with `ragen eval panel --out FILE`)", err=True, fg="red")
        raise typer.Exit(2)
    from flows.evaluate import evaluate_flow

    try:
        if checkpoint is not None and best:
            checkpoint = str(resolve_checkpoint(checkpoint, "best")[0])
        name = Path(checkpoint).name if checkpoint else (mlflow_model or "model").replace("@", "-").replace("/", "-")
        res = evaluate_flow(cfg, str(out or Path("reports/eval") / name), checkpoint, mlflow_model, greedy, log)
    except (ValueError, FileNotFoundError, KeyError) as e:
        typer.secho(str(e.args[0] if isinstance(e, KeyError) else e), err=True, fg="red")
        raise typer.Exit(2) from None
    _print_panel(res["metrics"])
    typer.echo(f"wrote {res['out']}/eval.json (+ rollouts.parquet); model {res['model']}")


def _print_panel(m: dict) -> None:
    tags = [k[: -len("/success")] for k in m if k.endswith("/success") and not k.startswith("all/")]
    typer.echo(f"{'tag':28s} {'success [95% CI]':24s} {'reward':>8s} {'resp len':>9s} {'format err':>10s}")
    for t in tags:
        typer.echo(f"{t:28s} {m[f'{t}/success']:6.3f} [{m[f'{t}/success_lo']:.3f}, {m[f'{t}/success_hi']:.3f}]"
                   f"{'':3s} {m[f'{t}/reward']:8.3f} {m[f'{t}/response_length']:9.1f} "
                   f"{m[f'{t}/format_error_rate']:10.3f}")


@eval_app.command("panel")
def eval_panel_cmd(out: Annotated[Path, typer.Option(help="panel JSON file to write")],
                   scale: Annotated[str, typer.Option(help="seeds per tag: paper 256, cpu-small 32, tiny 4")]
                   = "cpu-small",
                   tags: Annotated[list[str] | None, typer.Option("--tag", help="tags (repeatable; default: the "
                                                                  "paper's generalisation tags)")] = None,
                   n: Annotated[int | None, typer.Option(help="seeds per tag (overrides --scale)")] = None,
                   seed: Annotated[int, typer.Option(help="first seed (the original's val seed)")] = 123) -> None:
    """Write a fixed evaluation panel: consecutive seed blocks per tag from --seed."""
    from ragen.envs.registry import BUILTIN_TAGS
    from ragen.eval.panels import GENERALISATION_TAGS, PANEL_SIZES, make_panel, write_panel

    if n is None and scale not in PANEL_SIZES:
        typer.secho(f"--scale must be one of {', '.join(PANEL_SIZES)}", err=True, fg="red")
        raise typer.Exit(2)
    chosen = list(tags or GENERALISATION_TAGS)
    unknown = [t for t in chosen if t not in BUILTIN_TAGS]
    if unknown:
        typer.secho(f"unknown tag(s) {unknown}; known: {', '.join(sorted(BUILTIN_TAGS))}", err=True, fg="red")
        raise typer.Exit(2)
    p = write_panel(make_panel(scale if n is None else f"n{n}", chosen, n or PANEL_SIZES[scale], seed), out)
    typer.echo(f"wrote {p}: {len(chosen)} tags x {n or PANEL_SIZES[scale]} seeds")


@experiments_app.command("list")
def experiments_list(finding: Annotated[str | None, typer.Option(help="only this table/figure, e.g. table3")]
                     = None) -> None:
    """The named experiments: name, the paper finding, scales, description."""
    from ragen.experiments import EXPERIMENTS

    for e in EXPERIMENTS.values():
        if finding is None or e.finding == finding:
            typer.echo(f"{e.name:24s} {e.kind:5s} {e.finding or '-':7s} {','.join(e.scales):16s} {e.description}")


@experiments_app.command("show")
def experiments_show(name: str, scale: Annotated[str, typer.Option(help="cpu-small | paper")] = "cpu-small",
                     seed: int = 0) -> None:
    """The presets and overrides one experiment runs with at a scale, and its resolved config."""
    from ragen.experiments import resolve

    try:
        r = resolve(name, scale, seed)
    except KeyError as e:
        typer.secho(str(e.args[0]), err=True, fg="red")
        raise typer.Exit(2) from None
    typer.echo(f"# {r.experiment.description}\n# presets: {' '.join(r.presets)}\n# overrides:")
    for o in r.overrides:
        typer.echo(f"#   {o}")
    import yaml

    typer.echo(yaml.safe_dump(config_to_dict(_config(None, list(r.presets), list(r.overrides))), sort_keys=False))


GridParams = Annotated[Path, typer.Option("--params", help="params file with the `experiments` block")]
GridReports = Annotated[Path, typer.Option(help="per-run grid outputs")]


def _grid_call(fn: object, *args: object) -> dict:
    from ragen.run.rundir import ResumeError
    from tasks.versioning import VersioningError

    try:
        return fn(*args)  # type: ignore[operator]
    except (KeyError, ValueError, FileNotFoundError, ConfigError, ResumeError, VersioningError) as e:
        typer.secho(str(e.args[0] if isinstance(e, KeyError) else e), err=True, fg="red")
        raise typer.Exit(2) from None


@runs_app.command("compare")
def runs_compare_cmd(runs: Annotated[list[Path], typer.Argument(help="run directories (runs/<name>)")],
                     out: Annotated[Path | None, typer.Option(help="write summary.json, compare.md and compare.png "
                                                                   "here")] = None,
                     key: Annotated[list[str] | None, typer.Option(help="metrics to compare (repeatable)")] = None,
                     ) -> None:
    """Runs side by side: kept and rolled-back iterations, collapse-guard rollbacks, first vs last values."""
    from ragen.report.compare import KEYS, markdown, plot_compare, summarize

    keys = tuple(key or KEYS)
    missing = [str(r) for r in runs if not (r / "config.yaml").is_file()]
    if missing:
        typer.secho(f"not run directories (no config.yaml): {', '.join(missing)}", err=True, fg="red")
        raise typer.Exit(2)
    rows = [summarize(r, keys) for r in runs]
    table = markdown(rows, keys)
    typer.echo(table)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
        (out / "compare.md").write_text(table + "\n")
        typer.echo(f"wrote {plot_compare(runs, out / 'compare.png', keys)}, {out / 'summary.json'}")


@grid_app.command("list")
def grid_list(params: GridParams = Path("params.yaml")) -> None:
    """The grid's runs (experiment x seed) at its scale, with their run names."""
    from flows.ablations import grid_config
    from ragen.experiments import read_grid

    g = _grid_call(read_grid, params)
    typer.echo(f"scale {g.scale}, sweep {g.sweep_name}, {len(g.runs())} runs")
    for name, seed in g.runs():
        r, cfg, run_name = grid_config(g, name, seed)
        typer.echo(f"  {name:24s} seed {seed}  runs/{run_name}  ({cfg.trainer.total_training_steps} iterations, "
                   f"{r.experiment.description})")


@grid_app.command("train")
def grid_train_cmd(name: Annotated[str, typer.Option(help="experiment name")], seed: int = 0,
                   params: GridParams = Path("params.yaml"), reports: GridReports = Path("reports/grid")) -> None:
    """Train one grid run (continuing it if it exists) and export its metrics to reports/grid/<name>-s<seed>/."""
    from flows.ablations import grid_train

    s = _grid_call(grid_train, name, seed, str(params), str(reports))
    typer.echo(f"{name} seed {seed}: {s['iterations']} iterations in {s['run_dir']}; val score "
               f"{s.get('val/score', float('nan')):.3f}")


@grid_app.command("eval")
def grid_eval_cmd(name: Annotated[str, typer.Option(help="experiment name")], seed: int = 0,
                  params: GridParams = Path("params.yaml"), reports: GridReports = Path("reports/grid")) -> None:
    """Score one trained grid run's last checkpoint on the panel (reports/grid/<name>-s<seed>/eval/)."""
    from flows.ablations import grid_evaluate

    res = _grid_call(grid_evaluate, name, seed, str(params), str(reports))
    _print_panel(res["metrics"])


@grid_app.command("report")
def grid_report_cmd(params: GridParams = Path("params.yaml"), reports: GridReports = Path("reports/grid"),
                    out: Annotated[Path, typer.Option(help="report markdown (figures beside it)")]
                    = Path("reports/ablations.md")) -> None:
    """Write the ablation report (ours vs the paper, verdicts, figures, Echo Trap table) from the scored runs."""
    from flows.ablations import grid_report

    res = _grid_call(grid_report, str(params), str(reports), str(out))
    typer.echo(f"wrote {res['report']} ({res['scored']} runs scored"
               + (f"; not yet: {', '.join(res['missing'])}" if res["missing"] else "") + f"), curves {res['curves']}")


@grid_app.command("plots")
def grid_plots_cmd(out: Annotated[Path, typer.Option(help="folder for index.html")] = Path("reports/plots"),
                   repo: Annotated[Path, typer.Option(help="the DVC project (its dvc.yaml plots)")] = Path("."))\
        -> None:
    """`dvc plots show` with vega, vega-lite and vega-embed inlined, so the page renders offline (DVC's own page
    loads them from a CDN). The scripts come once from their npm packages into ~/.cache/ragen/vega."""
    from ragen.report.vega_offline import ensure_template, render_dvc_plots

    try:
        page = render_dvc_plots(repo, out, ensure_template())
    except (FileNotFoundError, RuntimeError) as e:
        typer.secho(str(e), err=True, fg="red")
        raise typer.Exit(2) from None
    typer.echo(f"wrote {page} (self-contained: open it in any browser, no network needed)")


@grid_app.command("run")
def grid_run_cmd(params: GridParams = Path("params.yaml"), reports: GridReports = Path("reports/grid"),
                 out: Annotated[Path, typer.Option(help="report markdown")] = Path("reports/ablations.md")) -> None:
    """The whole grid without DVC: every run not yet scored (train, evaluate), then the report."""
    from flows.ablations import ablations_flow

    res = _grid_call(ablations_flow, str(params), str(reports), str(out))
    typer.echo(f"wrote {res['report']} ({res['scored']} runs scored)")


@grid_app.command("mlflow-restore")
def grid_mlflow_restore_cmd(params: GridParams = Path("params.yaml"), reports: GridReports = Path("reports/grid"),
                            out: Annotated[Path, typer.Option(help="the report, logged on the sweep's parent run")]
                            = Path("reports/ablations.md"),
                            tracking_uri: Annotated[str | None, typer.Option(
                                help="MLflow tracking URI (default: the grid config's tracking.mlflow_tracking_uri)")]
                            = None) -> None:
    """Rebuild the grid's MLflow runs from reports/grid (a fresh clone, a lost or new tracking database): each
    scored run as a child of the sweep's parent with its params, knobs, per-iteration and panel metrics. Runs
    already in MLflow are kept; running it twice adds nothing."""
    from flows.grid_tracking import grid_restore_tracking

    res = _grid_call(grid_restore_tracking, str(params), str(reports), str(out), tracking_uri)
    typer.echo(f"restored {len(res['restored'])} runs, {len(res['present'])} already in MLflow"
               + (f"; not scored: {', '.join(res['not_scored'])}" if res["not_scored"] else ""))
    for line in res["other_settings"]:
        typer.secho(f"not restored, scored with other settings: {line}", err=True, fg="yellow")


@services_app.command("mlflow")
def services_mlflow_cmd(
        postgres: Annotated[Path, typer.Option(help="PostgreSQL data directory (created on first use, kept)")]
        = Path("runs/services/postgres"),
        artifacts: Annotated[Path, typer.Option(help="the server's artifact store")] = Path("runs/services/artifacts"),
        port: Annotated[int, typer.Option(help="MLflow server port on 127.0.0.1")] = 5000,
        pg_port: Annotated[int, typer.Option(help="PostgreSQL port on 127.0.0.1")] = 5432) -> None:
    """A PostgreSQL cluster and an MLflow tracking server on it (127.0.0.1), until Ctrl-C. Train against it with
    --set tracking.mlflow_tracking_uri=http://127.0.0.1:PORT --set tracking.mlflow_artifact_location=null."""
    import signal
    import time

    from ragen.services import LocalMLflowServer, LocalPostgres, ServiceError

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        with LocalPostgres(postgres, port=pg_port) as pg, \
                LocalMLflowServer(pg.url, artifacts, port=port, log=postgres.parent / "mlflow-server.log") as srv:
            typer.echo(f"MLflow on {srv.url} (backend {pg.url}, artifacts {artifacts}); Ctrl-C stops both")
            while srv.proc is not None and srv.proc.poll() is None:
                time.sleep(1.0)
            typer.secho("mlflow server exited", err=True, fg="red")
            raise typer.Exit(1)
    except ServiceError as e:
        typer.secho(str(e), err=True, fg="red")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo("stopped")


@bench_app.command("envs")
def bench_envs_cmd(as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
                   seconds: Annotated[float, typer.Option(help="time per measurement")] = 2.0) -> None:
    """Room generation and env step throughput."""
    from ragen.bench import bench_envs

    _print_result(bench_envs(seconds), as_json)


@contextlib.contextmanager
def _stdout_to_stderr():
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


def _print_result(result: dict, as_json: bool) -> None:
    """A benchmark's result as one JSON object, or as an aligned key/value table."""
    if as_json:
        typer.echo(json.dumps(result))
        return
    def rows(d: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
        for k, v in d.items():
            yield from rows(v, f"{prefix}{k}/") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    for k, v in rows(result):
        typer.echo(f"{k:40s} {v:>12.3f}" if isinstance(v, float) else f"{k:40s} {v!s:>12}")


@bench_app.command("rollout")
def bench_rollout_cmd(as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
                      engine: Annotated[list[str] | None, typer.Option(help="engines to compare")] = None,
                      model: Annotated[str, typer.Option(help="model alias, path or hub id")] = "smollm2-135m-instruct",
                      groups: int = 8, group_size: int = 8, turns: int = 5, new_tokens: int = 128,
                      overrides: SetOpt = None) -> None:
    """Multi-turn rollout throughput: vLLM vs HF generate on the same SimpleSokoban workload (HF re-reads the
    whole conversation every turn, so its part takes most of the time: ~25 min here)."""
    from ragen.bench import bench_rollout

    with _stdout_to_stderr():
        result = bench_rollout(tuple(engine or ("vllm", "hf")), model=model, groups=groups,
                               group_size=group_size, turns=turns, new_tokens=new_tokens, extra=tuple(overrides or ()))
    _print_result(result, as_json)


@bench_app.command("memory")
def bench_memory_cmd(model: Annotated[str, typer.Option(help="qwen2.5-0.5b|1.5b|3b|7b or a local model directory")]
                     = "qwen2.5-0.5b",
                     gpus: Annotated[str, typer.Option(help="data-parallel sizes, comma-separated")] = "1,2,4,8",
                     fp32: Annotated[bool, typer.Option("--fp32", help="full fp32 instead of bf16 mixed")] = False,
                     no_critic: Annotated[bool, typer.Option("--no-critic", help="GRPO: no critic")] = False,
                     reference: Annotated[bool, typer.Option("--reference", help="a KL reference model too")] = False,
                     as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False) -> None:
    """Per-GPU memory of the training model states by ZeRO stage and GPU count (computed, ragen/train/memory.py)."""
    from ragen.train.memory import markdown, memory_report

    try:
        worlds = tuple(int(g) for g in gpus.split(","))
        rep = memory_report(model, worlds=worlds, mixed=not fp32, critic=not no_critic, reference=reference)
    except (ValueError, FileNotFoundError) as e:
        typer.secho(f"--model/--gpus: {e}", err=True, fg="red")
        raise typer.Exit(2) from None
    typer.echo(json.dumps(rep) if as_json else markdown(rep) + f"\nnot included: {rep['excludes']}")


@bench_app.command("train")
def bench_train_cmd(as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
                    model: Annotated[str, typer.Option(help="model alias, path or hub id")] = "smollm2-135m-instruct",
                    batch: Annotated[list[str] | None, typer.Option(
                        help="main (Bandit, the main command's batch) and/or multiturn (SimpleSokoban with "
                             "thinking, 5 turns); default: both")] = None,
                    compare: Annotated[bool, typer.Option(
                        "--compare/--no-compare", help="also update the main batch in fp32, with plain torch and "
                        "padded (ratios and the loss check)")] = True,
                    seed: int = 0) -> None:
    """The update against the machine: matmul peak in the model's shapes, model FLOPs, achieved FLOP/s and MFU
    of the actor and the critic on the main and a multi-turn batch; fp32, plain-torch and padded ratios."""
    from ragen.train.update_bench import BATCHES, bench_train

    batches = tuple(batch or BATCHES)
    unknown = [b for b in batches if b not in BATCHES]
    if unknown:
        typer.secho(f"--batch {', '.join(unknown)}: use main and/or multiturn", err=True, fg="red")
        raise typer.Exit(2)
    with _stdout_to_stderr():
        result = bench_train(model=model, batches=batches, compare=compare, seed=seed,
                             progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    _print_result(result, as_json)


@bench_app.command("learn")
def bench_learn_cmd(as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
                    iterations: Annotated[int | None, typer.Option(
                        help="training iterations (default: the config's trainer.total_training_steps)")] = None,
                    panel: Annotated[Path | None, typer.Option(help="seed panel file (`ragen eval panel`); default: "
                                                                    "--panel-size seeds per tag from seed 123")]
                    = None,
                    panel_size: Annotated[int, typer.Option(help="seeds per tag of the panel made when --panel is "
                                                                 "not given")] = 128,
                    tags: Annotated[list[str] | None, typer.Option(
                        "--tag", help="panel tag (repeatable); default: eval.tags, else envs.val.tags")] = None,
                    out: Annotated[Path | None, typer.Option(
                        help="a new directory for the run, learn.json, curve.csv and curve.png (default: "
                             "runs/bench-learn/<UTC time>)")] = None,
                    quick: Annotated[bool, typer.Option("--quick", help="a smoke run of a few minutes: 4x4 "
                                                        "rollouts, 2 iterations, a 16-seed panel")] = False,
                    keep_checkpoints: Annotated[bool, typer.Option(
                        "--keep-checkpoints", help="keep the run's checkpoints (deleted at the end by default)")]
                    = False,
                    experiment: Annotated[str | None, typer.Option(
                        help="a named experiment (`ragen experiments list`) instead of params.yaml")] = None,
                    scale: Annotated[str, typer.Option(help="the experiment's scale: cpu-small | paper")]
                    = "cpu-small",
                    redraw: Annotated[Path | None, typer.Option(
                        help="redraw the CSVs and curve.png of a finished measurement (its --out directory) "
                             "from its run directory, and stop")] = None,
                    params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Learning as a benchmark: train a fresh run (vLLM + DeepSpeed, plain loop) and score a fixed panel before,
    every trainer.test_freq and after; per tag success before/after (Wilson 95%) and the change (Newcombe 95%).
    Default: the main command's settings (params.yaml: cpu-small + cpu-bandit, Bandit with thinking, 6 iterations)."""
    from ragen.run.learn_bench import LearnSpec, bench_learn
    from ragen.run.learn_bench import redraw as redraw_files

    if redraw is not None:
        try:
            result = redraw_files(redraw)
        except FileNotFoundError as e:
            typer.secho(str(e), err=True, fg="red")
            raise typer.Exit(2) from None
        typer.echo(json.dumps(result) if as_json else f"{result['plot']}, {result['curve']}, {result['training']}")
        return
    if experiment is not None:
        r = _experiment(experiment, scale, 0, overrides)
        params, preset, overrides = None, list(r.presets), list(r.overrides)
    elif params is None and not preset and Path("params.yaml").is_file():
        params = Path("params.yaml")  # the main command's settings
    elif params is None and not preset:
        preset = ["cpu-small"]
    _config(params, preset, overrides)  # bad settings fail before any model loads, naming the key
    if out is None:
        out = Path("runs") / "bench-learn" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    spec = LearnSpec(params=str(params) if params else None, presets=tuple(preset or ()),
                     overrides=tuple(overrides or ()), iterations=iterations, panel=str(panel) if panel else None,
                     panel_size=panel_size, tags=tuple(tags) if tags else None, out=str(out), quick=quick,
                     keep_checkpoints=keep_checkpoints, experiment=experiment)
    try:
        with _stdout_to_stderr():
            result = bench_learn(spec)
    except (FileExistsError, FileNotFoundError, KeyError, ValueError) as e:
        typer.secho(str(e.args[0]) if isinstance(e, KeyError) else str(e), err=True, fg="red")
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(result))
        return
    for tag, t in result["tags"].items():
        typer.echo(f"{tag:26s} success {t['before']:.1%} [{t['before_ci'][0]:.1%}, {t['before_ci'][1]:.1%}] -> "
                   f"{t['after']:.1%} [{t['after_ci'][0]:.1%}, {t['after_ci'][1]:.1%}]; change "
                   f"{t['diff']:+.1%} [{t['diff_ci'][0]:+.1%}, {t['diff_ci'][1]:+.1%}] (n={t['n']})")
    typer.echo(f"{result['iterations']} iterations in {result['wall_s']:.0f} s ({result['s_per_iteration']:.0f} s "
               f"each, update {result['update_share']:.0%}); {Path(result['curve']).parent}/learn.json, curve.csv")


@bench_app.command("learn-mlflow")
def bench_learn_mlflow_cmd(outs: Annotated[list[Path], typer.Argument(help="--out directories of finished "
                                                                        "`ragen bench learn` runs")],
                           tracking_uri: Annotated[str | None, typer.Option(
                               help="MLflow tracking URI (default: params.yaml's tracking.mlflow_tracking_uri)")]
                           = None,
                           export: Annotated[Path | None, typer.Option(
                               help="also write the experiment's runs (result metrics, differing settings) "
                                    "as CSV here")] = None) -> None:
    """Log finished learning measurements to MLflow (experiment ragen-learning, one run per directory, kept
    when already there), to compare them in the MLflow UI."""
    from flows.learning_tracking import learn_tracking

    missing = [str(o) for o in outs if not (o / "learn.json").is_file()]
    if missing:
        typer.secho(f"no learn.json in {', '.join(missing)}: give --out directories of finished "
                    f"`ragen bench learn` runs", err=True, fg="red")
        raise typer.Exit(2)
    res = learn_tracking([str(o) for o in outs], tracking_uri, str(export) if export else None)
    for r in res["runs"]:
        typer.echo(f"{r['run']}: {'logged' if r['logged'] else 'already in MLflow'} ({r['run_id']})")
    if export:
        typer.echo(f"wrote {res['export']}")


@bench_app.command("faults")
def bench_faults_cmd(as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
                     quick: Annotated[bool, typer.Option("--quick", help="only the cases that do not train "
                                                                         "(about a minute)")] = False) -> None:
    """The fault-injection suite (tests/faults): SIGKILL in rollout, update and DVC push, MLflow outage, full disk,
    damaged files, bad settings, concurrent runs, adversarial model output. Prints faults tried, survived and
    files of completed iterations lost (must be 0); exits 1 if any fault was not survived."""
    from ragen.bench import bench_faults

    try:
        result = bench_faults(quick=quick)
    except FileNotFoundError as e:
        typer.secho(str(e), err=True, fg="red")
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for f in result["faults"]:
            typer.echo(f"{'survived' if f['survived'] else 'FAILED':8s}  {f['name']}")
        typer.echo(f"faults tried {result['faults_tried']}, survived {result['survived']}, data lost "
                   f"{result['data_lost']} files; {result['wall_s']:.0f} s")
    if result["pytest_exit_code"] != 0 or result["survived"] < result["faults_tried"] or result["data_lost"]:
        raise typer.Exit(1)


@bench_app.command("pipeline")
def bench_pipeline_cmd(as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
                       iterations: Annotated[int, typer.Option(help="iterations, alternating plain / orchestrated")]
                       = 4,
                       params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Share of an iteration's wall time spent in orchestration (Prefect + MLflow + DVC) vs plain calls, in one
    run at the given preset (default cpu-small) in a temporary DVC repo and MLflow database."""
    from flows.bench_pipeline import bench_pipeline

    _config(params, preset or ["cpu-small"], overrides)  # bad settings fail before any model loads
    with _stdout_to_stderr():
        result = bench_pipeline(str(params) if params else None, preset or ["cpu-small"], overrides or [],
                                iterations)
    if not as_json:
        result.pop("rows")
    _print_result(result, as_json)


@models_app.command("prepare")
def models_prepare(base: Annotated[str, typer.Option(help="model alias (smollm2-135m-instruct, tiny-random-llama), "
                                                       "local path or hub id")] = "smollm2-135m-instruct",
                   manifest: Annotated[Path | None, typer.Option(help="also write a JSON manifest (path, sha256 of "
                                                                      "each file): the dvc.yaml stage's output")]
                   = None) -> None:
    """Build a model's weights once into the cache (the bundled SmolLM2 from its GGUF file; the tiny test model
    from scratch) and verify it; a no-op when already built."""
    import hashlib
    import time

    from ragen.models import ensure_model

    t0 = time.perf_counter()
    try:
        path = ensure_model(base)
    except (FileNotFoundError, RuntimeError) as e:
        typer.secho(str(e), err=True, fg="red")
        raise typer.Exit(1) from None
    marker = Path(path) / "ragen-prepared.json"
    note = f" (verified: {json.loads(marker.read_text())['verify_answer']!r})" if marker.is_file() else ""
    typer.echo(f"{base}: ready at {path} in {time.perf_counter() - t0:.1f} s{note}")
    if manifest is not None:
        files = {}
        for f in sorted(Path(path).rglob("*")):
            if f.is_file() and f.name != "ragen-prepared.json":
                h = hashlib.sha256()
                with f.open("rb") as fh:
                    for chunk in iter(lambda fh=fh: fh.read(1 << 22), b""):
                        h.update(chunk)
                files[str(f.relative_to(path))] = h.hexdigest()
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"base": base, "path": str(path), "sha256": files}, indent=1) + "\n")
        typer.echo(f"manifest: {manifest}")


@models_app.command("tokenizer")
def models_tokenizer(base: Annotated[str, typer.Option(help="model alias, path or hub id")] = "smollm2-135m-instruct",
                     ) -> None:
    """Make the tokenizer of a model available (extracts the bundled model's tokenizer from its GGUF file)."""
    from ragen.models import load_tokenizer, resolve_model_path

    try:
        tok = load_tokenizer(base)
    except FileNotFoundError as e:
        typer.secho(str(e), err=True, fg="red")
        raise typer.Exit(1) from None
    typer.echo(f"{base}: tokenizer at {resolve_model_path(base)} (vocab {len(tok)}, eos {tok.eos_token})")


def main() -> None:
    # in-process flows start an ephemeral Prefect server: no telemetry from it (this machine has no internet, and
    # each attempt logs an error); a user who wants it sets the variable
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # its start-up can take longer than Prefect's 20 s when other runs (or a grid) load both cores: a second run
    # started beside a first one timed out here and failed after training
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
