"""`ragen envs ...` commands."""

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
)

app = typer.Typer(no_args_is_help=True, help="Inspect environments and generate instances.")


@app.command("list")
def envs_list() -> None:
    """List env tags with their env type and settings."""
    from ragen.envs import BUILTIN_TAGS

    for spec in BUILTIN_TAGS.values():
        typer.echo(f"{spec.tag:28s} {spec.env_id:22s} {dict(spec.env_kwargs)}")


@app.command("show")
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

    cfg = config_or_exit(params, preset or ["cpu-small"], overrides)
    try:
        spec = get_tag(tag, cfg.tag_specs())
    except KeyError as e:
        fail(str(e.args[0]))
    env = spec.make()
    if state_only:
        typer.echo(env.reset(seed=seed)[0])
        return
    tok = load_tokenizer(cfg.model.base, cfg.model.tokenizer, cfg.model.trust_remote_code)
    renderer = ChatRenderer(tok, cfg.model.end_of_turn_token)
    episode = Episode(env, spec, cfg.agent, renderer, seed=seed)
    typer.echo(tok.decode(episode.prompt_ids()))


@app.command("instances")
def envs_instances(out: Annotated[Path, typer.Option(help="output parquet file")],
                   mode: Annotated[str, typer.Option(help="train or val")] = "train",
                   iteration: Annotated[int, typer.Option(help="training iteration (train mode)")] = 0,
                   params: ParamsOpt = None, preset: PresetOpt = None, overrides: SetOpt = None) -> None:
    """Generate one iteration's env instances (the pipeline's first stage) and write them as parquet."""
    from ragen.envs.instances import write_instances
    from ragen.rollout.runner import instances_for

    if mode not in ("train", "val"):
        fail(f"--mode must be train or val, got {mode!r}")
    cfg = config_or_exit(params, preset or ["cpu-small"], overrides)
    df = instances_for(cfg, mode, iteration)
    write_instances(df, out)
    summary = df.groupby("tag").agg(envs=("env_id", "size"), groups=("group", "nunique"),
                                    seeds=("seed", lambda s: f"{s.min()}..{s.max()}"),
                                    mean_optimal_length=("optimal_length", "mean"))
    typer.echo(summary.to_string())
    typer.echo(f"wrote {len(df)} instances to {out}")
