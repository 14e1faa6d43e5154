"""`ragen sft ...` commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.common import (
    ParamsOpt,
    PresetOpt,
    SetOpt,
    config_or_exit,
    fail,
)

app = typer.Typer(no_args_is_help=True, help="SFT warm-start on solver demonstrations.")


def _sft_presets(params: Path | None, preset: list[str] | None) -> list[str]:
    """The `ragen sft` commands agree on the config (hence on the demos' fingerprint): the given presets, or
    cpu-small when neither a params file nor a preset is given."""
    return list(preset or ([] if params else ["cpu-small"]))


def _print_format(title: str, m: dict) -> None:
    typer.echo(title)
    for k, v in m.items():
        if k.endswith(("/format_valid", "/success", "/hi_arm_share", "format_valid_mean")):
            typer.echo(f"  {k:36s} {v:8.3f}")


@app.command("train")
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
            fail(str(err.args[0]))
        preset, overrides = [*e.presets, *(preset or [])], [*e.overrides, *(overrides or [])]
    preset = _sft_presets(params, preset)
    cfg = config_or_exit(params, preset, overrides)
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


@app.command("demos")
def sft_demos_cmd(params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None,
                  out: Annotated[Path | None, typer.Option(help="parquet file (default: sft.demos)")] = None,
                  ) -> None:
    """Make the solver demonstrations (train and test splits) as a parquet table."""
    from ragen.sft.pipeline import make_demos_stage

    cfg = config_or_exit(params, _sft_presets(params, preset), overrides)
    path = make_demos_stage(cfg, out, progress=True)
    typer.echo(path.with_suffix(".json").read_text())
    typer.echo(f"wrote {path}")


@app.command("eval")
def sft_eval_cmd(out: Annotated[Path, typer.Option(help="metrics JSON to write")],
                 model: Annotated[str | None, typer.Option(help="model directory (default: model.base)")] = None,
                 params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Format evaluation with thinking on the fixed SFT evaluation seeds (sft.eval_n per tag)."""
    from ragen.sft.pipeline import evaluate_stage

    cfg = config_or_exit(params, _sft_presets(params, preset), overrides)
    _print_format(f"format of {model or cfg.model.base}:", evaluate_stage(cfg, model, out))
