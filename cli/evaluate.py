"""`ragen eval ...` commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import (
    ParamsOpt,
    PresetOpt,
    SetOpt,
    config_or_exit,
    fail,
    print_panel,
)

app = typer.Typer(help="Score a checkpoint on a fixed seed panel (`ragen eval --checkpoint ... --panel ...`); "
                            "`ragen eval panel` makes a panel.")


@app.callback(invoke_without_command=True)
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
    from ragen.run.evaluation import resolve_checkpoint

    over = [*(overrides or [])]
    if checkpoint is not None and params is None and not preset and (Path(checkpoint) / "config.yaml").is_file():
        params = Path(checkpoint) / "config.yaml"  # score a run with the settings it trained with
    if panel is not None:
        over.append(f"eval.panel={panel}")
    if tags:
        over.append(f"eval.tags=[{','.join(tags)}]")
    if samples is not None:
        over.append(f"eval.pass_k={samples}")
    cfg = config_or_exit(params, preset, over)
    if cfg.eval.panel is None:
        fail("no panel: give --panel FILE (make one with `ragen eval panel --out FILE`)")
    from flows.evaluate import evaluate_flow

    try:
        if checkpoint is not None and best:
            checkpoint = str(resolve_checkpoint(checkpoint, "best")[0])
        name = Path(checkpoint).name if checkpoint else (mlflow_model or "model").replace("@", "-").replace("/", "-")
        res = evaluate_flow(cfg, str(out or Path("reports/eval") / name), checkpoint, mlflow_model, greedy, log)
    except (ValueError, FileNotFoundError, KeyError) as e:
        fail(str(e.args[0] if isinstance(e, KeyError) else e))
    print_panel(res["metrics"])
    typer.echo(f"wrote {res['out']}/eval.json (+ rollouts.parquet); model {res['model']}")


@app.command("panel")
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
        fail(f"--scale must be one of {', '.join(PANEL_SIZES)}")
    chosen = list(tags or GENERALISATION_TAGS)
    unknown = [t for t in chosen if t not in BUILTIN_TAGS]
    if unknown:
        fail(f"unknown tag(s) {unknown}; known: {', '.join(sorted(BUILTIN_TAGS))}")
    p = write_panel(make_panel(scale if n is None else f"n{n}", chosen, n or PANEL_SIZES[scale], seed), out)
    typer.echo(f"wrote {p}: {len(chosen)} tags x {n or PANEL_SIZES[scale]} seeds")
