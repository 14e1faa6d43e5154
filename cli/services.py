"""`ragen services ...` commands."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from cli.common import (
    fail,
    sigterm_as_interrupt,
)

app = typer.Typer(no_args_is_help=True, help="Local servers for tracking at scale (infra/mlflow/).")


@app.command("mlflow")
def services_mlflow_cmd(
        postgres: Annotated[Path, typer.Option(help="PostgreSQL data directory (created on first use, kept)")]
        = Path("runs/services/postgres"),
        artifacts: Annotated[Path, typer.Option(help="the server's artifact store")] = Path("runs/services/artifacts"),
        port: Annotated[int, typer.Option(help="MLflow server port on 127.0.0.1")] = 5000,
        pg_port: Annotated[int, typer.Option(help="PostgreSQL port on 127.0.0.1")] = 5432) -> None:
    """A PostgreSQL cluster and an MLflow tracking server on it (127.0.0.1), until Ctrl-C. Train against it with
    --set tracking.mlflow_tracking_uri=http://127.0.0.1:PORT --set tracking.mlflow_artifact_location=null."""
    from servers.local import LocalMLflowServer, LocalPostgres, ServiceError

    try:
        with sigterm_as_interrupt(), LocalPostgres(postgres, port=pg_port) as pg, \
                LocalMLflowServer(pg.url, artifacts, port=port, log=postgres.parent / "mlflow-server.log",
                                  env=pg.client_env) as srv:
            typer.echo(f"MLflow on {srv.url} (backend {pg.url}, artifacts {artifacts}); Ctrl-C stops both")
            while srv.proc is not None and srv.proc.poll() is None:
                time.sleep(1.0)
            fail("mlflow server exited", 1)
    except ServiceError as e:
        fail(str(e))
    except KeyboardInterrupt:
        typer.echo("stopped")
