"""`ragen models ...` commands."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from cli.common import (
    fail,
)

app = typer.Typer(no_args_is_help=True, help="Prepare and locate models.")


@app.command("prepare")
def models_prepare(base: Annotated[str, typer.Option(help="model alias (smollm2-135m-instruct, tiny-random-llama), "
                                                       "local path or hub id")] = "smollm2-135m-instruct",
                   manifest: Annotated[Path | None, typer.Option(help="also write a JSON manifest (path, sha256 of "
                                                                      "each file): the dvc.yaml stage's output")]
                   = None) -> None:
    """Build a model's weights once into the cache (the bundled SmolLM2 from its GGUF file; the tiny test model
    from scratch) and verify it; a no-op when already built."""
    import hashlib

    from ragen.models import ensure_model

    t0 = time.perf_counter()
    try:
        path = ensure_model(base)
    except (FileNotFoundError, RuntimeError) as e:
        fail(str(e), 1)
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


@app.command("tokenizer")
def models_tokenizer(base: Annotated[str, typer.Option(help="model alias, path or hub id")] = "smollm2-135m-instruct",
                     ) -> None:
    """Make the tokenizer of a model available (extracts the bundled model's tokenizer from its GGUF file)."""
    from ragen.models import load_tokenizer, resolve_model_path

    try:
        tok = load_tokenizer(base)
    except FileNotFoundError as e:
        fail(str(e), 1)
    typer.echo(f"{base}: tokenizer at {resolve_model_path(base)} (vocab {len(tok)}, eos {tok.eos_token})")
