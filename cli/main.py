"""`ragen ...`: the command groups assembled, and the entry point."""

from __future__ import annotations

import os
import sys

import typer

from cli import bench, config, envs, evaluate, experiments, grid, models, runs, services, sft, training

app = typer.Typer(no_args_is_help=True, add_completion=False, help="RAGEN / StarPO pipeline tools.")
app.command("train")(training.train_cmd)
app.command("up")(training.up_cmd)
app.command("rollout")(training.rollout_cmd)
for name, group in (("envs", envs), ("bench", bench), ("config", config), ("models", models), ("sft", sft),
                    ("eval", evaluate), ("experiments", experiments), ("grid", grid), ("runs", runs),
                    ("services", services)):
    app.add_typer(group.app, name=name)


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
