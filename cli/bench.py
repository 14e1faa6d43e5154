"""`ragen bench ...` commands."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from cli.common import (
    JsonOpt,
    ParamsOpt,
    PresetOpt,
    SetOpt,
    config_or_exit,
    experiment_or_exit,
    fail,
    print_result,
    stdout_to_stderr,
)

app = typer.Typer(no_args_is_help=True, help="Measurements: speed, memory, learning, faults, the pipeline (--json "
                                             "prints JSON; memory prints a Markdown table).")


@app.command("envs")
def bench_envs_cmd(as_json: JsonOpt = False,
                   seconds: Annotated[float, typer.Option(help="time per measurement")] = 2.0) -> None:
    """Room generation and env step throughput."""
    from ragen.bench import bench_envs

    print_result(bench_envs(seconds), as_json)


@app.command("rollout")
def bench_rollout_cmd(as_json: JsonOpt = False,
                      engine: Annotated[list[str] | None, typer.Option(help="engines to compare")] = None,
                      model: Annotated[str, typer.Option(help="model alias, path or hub id")] = "smollm2-135m-instruct",
                      groups: int = 8, group_size: int = 8, turns: int = 5, new_tokens: int = 128,
                      overrides: SetOpt = None) -> None:
    """Multi-turn rollout throughput: vLLM vs HF generate on the same SimpleSokoban workload (HF re-reads the
    whole conversation every turn, so its part takes most of the time: ~25 min here)."""
    from ragen.bench import bench_rollout

    with stdout_to_stderr():
        result = bench_rollout(tuple(engine or ("vllm", "hf")), model=model, groups=groups,
                               group_size=group_size, turns=turns, new_tokens=new_tokens, extra=tuple(overrides or ()))
    print_result(result, as_json)


@app.command("memory")
def bench_memory_cmd(model: Annotated[str, typer.Option(help="qwen2.5-0.5b|1.5b|3b|7b or a local model directory")]
                     = "qwen2.5-0.5b",
                     gpus: Annotated[str, typer.Option(help="data-parallel sizes, comma-separated")] = "1,2,4,8",
                     fp32: Annotated[bool, typer.Option("--fp32", help="full fp32 instead of bf16 mixed")] = False,
                     no_critic: Annotated[bool, typer.Option("--no-critic", help="GRPO: no critic")] = False,
                     reference: Annotated[bool, typer.Option("--reference", help="a KL reference model too")] = False,
                     preset: PresetOpt = None, params: ParamsOpt = None, overrides: SetOpt = None,
                     gpu_gib: Annotated[float, typer.Option(help="with --preset/--params: the GPU's memory")] = 80.0,
                     as_json: JsonOpt = False) -> None:
    """Per-GPU memory of the training model states by ZeRO stage and GPU count; with --preset/--params, one GPU
    shared by vLLM and DeepSpeed under that config, per phase (computed, ragen/train/memory.py)."""
    from ragen.train.memory import config_budget, markdown, memory_report

    if preset or params:
        from ragen.run.disk import disk_plan, lora_parameters

        cfg = config_or_exit(params, preset, overrides)
        try:
            rep = config_budget(cfg, gpu_gib=gpu_gib)
            rep["disk"] = disk_plan(cfg, rep["parameters"], lora_parameters(cfg, rep["model"])).as_dict()
        except (ValueError, FileNotFoundError) as e:
            fail(f"--preset/--params: {e}")
        if as_json:
            typer.echo(json.dumps(rep))
            return
        typer.echo(f"{rep['model']} ({rep['parameters'] / 1e9:.2f}B), ZeRO-{rep['zero_stage']} on one {gpu_gib:g} GiB "
                   f"GPU shared with vLLM (sleep during the update: {rep['sleep_during_update']})")
        for phase in ("rollout", "update"):
            typer.echo(f"  {phase:8s} {rep[f'{phase}_phase_gib']:7.2f} GiB in use, "
                       f"{rep[f'{phase}_headroom_gib']:7.2f} GiB left for activations and buffers")
        d = rep["disk"]
        typer.echo(f"disk: a checkpoint {d['checkpoint'] / 1e9:.2f} GB ({d['model_files'] / 1e9:.2f} GB actor, "
                   f"{d['resume_state'] / 1e9:.2f} GB resume state), one written per iteration; "
                   f"{d['iterations']} iterations keeping every {d['checkpoint_every']}th with the resume state in "
                   f"{'the latest only' if d['resume_state_kept'] == 'latest' else 'each'}: "
                   f"{d['peak'] / 1e9:.1f} GB at the peak ({d['kept_at_peak']} checkpoints; computed)")
        return
    try:
        worlds = tuple(int(g) for g in gpus.split(","))
        rep = memory_report(model, worlds=worlds, mixed=not fp32, critic=not no_critic, reference=reference)
    except (ValueError, FileNotFoundError) as e:
        fail(f"--model/--gpus: {e}")
    typer.echo(json.dumps(rep) if as_json else markdown(rep) + f"\nnot included: {rep['excludes']}")


@app.command("train")
def bench_train_cmd(as_json: JsonOpt = False,
                    model: Annotated[str, typer.Option(help="model alias, path or hub id")] = "smollm2-135m-instruct",
                    batch: Annotated[list[str] | None, typer.Option(
                        help="main (Bandit, the main command's batch) and/or multiturn (SimpleSokoban with "
                             "thinking, 5 turns); default: both")] = None,
                    compare: Annotated[bool, typer.Option(
                        "--compare/--no-compare", help="also update the main batch in fp32, with plain torch, "
                        "padded and with LoRA (ratios and the loss check)")] = True,
                    lora_rank: Annotated[int, typer.Option(
                        min=0, help="LoRA rank of the comparison (alpha = rank, all linear layers); 0: none")] = 64,
                    seed: int = 0) -> None:
    """The update against the machine: matmul peak in the model's shapes, model FLOPs, achieved FLOP/s and MFU
    of the actor and the critic on the main and a multi-turn batch; fp32, plain-torch, padded and LoRA ratios."""
    from ragen.train.update_bench import BATCHES, bench_train

    batches = tuple(batch or BATCHES)
    unknown = [b for b in batches if b not in BATCHES]
    if unknown:
        fail(f"--batch {', '.join(unknown)}: use main and/or multiturn")
    with stdout_to_stderr():
        result = bench_train(model=model, batches=batches, compare=compare, seed=seed, lora_rank=lora_rank,
                             progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print_result(result, as_json)


def learn_sources(params: Path | None, preset: list[str] | None) -> tuple[Path | None, list[str] | None]:
    """`bench learn`'s settings sources: given ones as they are; none at all: the main command's (./params.yaml,
    else the cpu-small preset)."""
    if params is None and not preset:
        return (Path("params.yaml"), preset) if Path("params.yaml").is_file() else (None, ["cpu-small"])
    return params, preset


@app.command("learn")
def bench_learn_cmd(as_json: JsonOpt = False,
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
                    resume: Annotated[bool, typer.Option(
                        "--resume", help="continue the unfinished measurement in --out (stopped or killed) after its "
                                         "last completed iteration, with the settings it started with")] = False,
                    redraw: Annotated[Path | None, typer.Option(
                        help="redraw the CSVs and curve.png of a finished measurement (its --out directory) "
                             "from its run directory, and stop")] = None,
                    params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Learning as a benchmark: train a fresh run (vLLM + DeepSpeed, plain loop) and score a fixed panel before,
    every trainer.test_freq and after; per tag success before/after (Wilson 95%) and the change (Newcombe 95%).
    Default: the main command's settings (params.yaml: cpu-small + cpu-bandit, Bandit with thinking, 6 iterations)."""
    from ragen.report.learning_curve import add_figure
    from ragen.run.learn_bench import SPEC_JSON, LearnSpec, bench_learn
    from ragen.run.learn_bench import redraw as redraw_files

    if redraw is not None:
        try:
            redraw_files(redraw)
        except FileNotFoundError as e:
            fail(str(e))
        result = add_figure(redraw)
        typer.echo(json.dumps(result) if as_json else f"{result['plot']}, {result['curve']}, {result['training']}")
        return
    if resume:
        given = [n for n, v in (("--params", params), ("--preset", preset), ("--set", overrides),
                                ("--experiment", experiment), ("--iterations", iterations), ("--panel", panel))
                 if v]
        if out is None or given:
            fail(f"--resume continues the measurement in --out with the settings saved there ({SPEC_JSON}): give "
                 f"--out alone" + (f", without {', '.join(given)}" if given else ""))
        spec = LearnSpec(out=str(out))  # bench_learn continues with the settings saved in --out
    else:
        if experiment is not None:
            r = experiment_or_exit(experiment, scale, 0, overrides)
            params, preset, overrides = None, list(r.presets), list(r.overrides)
        else:
            params, preset = learn_sources(params, preset)
        config_or_exit(params, preset, overrides)  # bad settings fail before any model loads, naming the key
        if out is None:
            out = Path("runs") / "bench-learn" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        spec = LearnSpec(params=str(params) if params else None, presets=tuple(preset or ()),
                         overrides=tuple(overrides or ()), iterations=iterations,
                         panel=str(panel) if panel else None, panel_size=panel_size,
                         tags=tuple(tags) if tags else None, out=str(out), quick=quick,
                         keep_checkpoints=keep_checkpoints, experiment=experiment)
    try:
        with stdout_to_stderr():
            result = bench_learn(spec, resume=resume)
    except (FileExistsError, FileNotFoundError, KeyError, ValueError) as e:
        fail(str(e.args[0]) if isinstance(e, KeyError) else str(e))
    result = add_figure(Path(spec.out))
    if as_json:
        typer.echo(json.dumps(result))
        return
    for tag, t in result["tags"].items():
        typer.echo(f"{tag:26s} success {t['before']:.1%} [{t['before_ci'][0]:.1%}, {t['before_ci'][1]:.1%}] -> "
                   f"{t['after']:.1%} [{t['after_ci'][0]:.1%}, {t['after_ci'][1]:.1%}]; change "
                   f"{t['diff']:+.1%} [{t['diff_ci'][0]:+.1%}, {t['diff_ci'][1]:+.1%}] (n={t['n']})")
    typer.echo(f"{result['iterations']} iterations in {result['wall_s']:.0f} s ({result['s_per_iteration']:.0f} s "
               f"each, update {result['update_share']:.0%}); {Path(result['curve']).parent}/learn.json, curve.csv, "
               f"curve.png")


@app.command("learn-mlflow")
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
        fail(f"no learn.json in {', '.join(missing)}: give --out directories of finished "
                    f"`ragen bench learn` runs")
    res = learn_tracking([str(o) for o in outs], tracking_uri, str(export) if export else None)
    for r in res["runs"]:
        typer.echo(f"{r['run']}: {'logged' if r['logged'] else 'already in MLflow'} ({r['run_id']})")
    if export:
        typer.echo(f"wrote {res['export']}")


@app.command("faults")
def bench_faults_cmd(as_json: JsonOpt = False,
                     quick: Annotated[bool, typer.Option("--quick", help="only the cases that do not train "
                                                                         "(about a minute)")] = False) -> None:
    """The fault-injection suite (tests/faults): SIGKILL in rollout, update and DVC push, MLflow outage, full disk,
    damaged files, bad settings, concurrent runs, adversarial model output. Prints the faults by kind (real,
    simulated; bad inputs apart), those not tried and why, survived, and distinct guarded files lost (must be 0);
    exits 1 if a tried fault was not survived or a bad input not refused."""
    from cli.fault_bench import bench_faults

    try:
        result = bench_faults(quick=quick)
    except FileNotFoundError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for f in result["faults"]:
            state = "not tried" if f.get("not_tried") else "survived" if f["survived"] else "FAILED"
            typer.echo(f"{state:9s}  {f['kind']:9s}  {f['name']}" + (f"  [{f['not_tried']}]" if f.get("not_tried")
                                                                    else ""))
        typer.echo(f"faults tried {result['faults_tried']} ({result['real']} real, {result['simulated']} "
                   f"simulated), survived {result['survived']}; bad inputs {result['input']} (refused "
                   f"{result['inputs_refused']}); not tried {result['not_tried']}; data lost {result['data_lost']} "
                   f"of {result['guarded_files']} guarded files; {result['wall_s']:.0f} s")
    if result["pytest_exit_code"] != 0 or result["survived"] < result["faults_tried"] or result["data_lost"] \
            or result["inputs_refused"] < result["input"]:
        raise typer.Exit(1)


@app.command("pipeline")
def bench_pipeline_cmd(as_json: JsonOpt = False,
                       iterations: Annotated[int, typer.Option(help="iterations, alternating plain / orchestrated")]
                       = 4,
                       params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Share of an iteration's wall time spent in orchestration (Prefect + MLflow + DVC) vs plain calls, in one
    run at the given preset (default cpu-small) in a temporary DVC repo and MLflow database."""
    from flows.bench_pipeline import bench_pipeline

    config_or_exit(params, preset or ["cpu-small"], overrides)  # bad settings fail before any model loads
    with stdout_to_stderr():
        result = bench_pipeline(str(params) if params else None, preset or ["cpu-small"], overrides or [],
                                iterations)
    if not as_json:
        result.pop("rows")
    print_result(result, as_json)
