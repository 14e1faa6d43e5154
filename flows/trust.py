"""What a run triggered through a deployment may ask for. Whoever can trigger ``ragen/train-loop`` chooses its
parameters (params file, presets, overrides), and the worker carries them out with its own rights. So such a run
is refused, before anything loads, the settings that would run foreign code or read and write outside the
project, unless the worker's own environment allows them:

- ``model.trust_remote_code`` executes the model repository's Python on the worker: ``RAGEN_ALLOW_REMOTE_CODE=1``;
- local paths outside the project and the model cache: models read (``model.base``, ``model.tokenizer``,
  ``model.warm_start``), outputs written (``trainer.run_dir``, ``sft.output``) and the params file itself: extra
  roots in ``RAGEN_ALLOWED_ROOTS`` (separated by ``os.pathsep``).

A hub id (``org/name`` that is no local path) stays allowed: with remote code off it loads weights, not code.
``ragen train`` and the Python API run as their caller, who is trusted: nothing here applies to them."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from ragen.config import Config
from ragen.models.registry import ALIASES, cache_root

ALLOW_REMOTE_CODE = "RAGEN_ALLOW_REMOTE_CODE"
ALLOWED_ROOTS = "RAGEN_ALLOWED_ROOTS"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class UntrustedParameters(PermissionError):
    """A deployment run asked for something the worker does not allow."""


def allowed_roots(project: Path) -> list[Path]:
    extra = [Path(p).expanduser() for p in os.environ.get(ALLOWED_ROOTS, "").split(os.pathsep) if p.strip()]
    return [p.resolve() for p in (project, cache_root(), *extra)]


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _local(value: str, project: Path) -> Path | None:
    """The local path a setting names, or None for a model alias or a hub id that is no local path."""
    if value in ALIASES:
        return None
    p = Path(value).expanduser()
    p = p if p.is_absolute() else project / p
    if not p.exists() and _HUB_ID.match(value):
        return None
    return p.resolve()


def check_deployment_config(cfg: Config, params: str | None, project: str | Path = ".") -> None:
    """Raise ``UntrustedParameters`` naming every setting a deployment run may not use on this worker."""
    project = Path(project).resolve()
    roots = allowed_roots(project)
    problems = []
    if cfg.model.trust_remote_code and os.environ.get(ALLOW_REMOTE_CODE) != "1":
        problems.append(f"model.trust_remote_code=true runs the model repository's code on this worker (allow it "
                        f"with {ALLOW_REMOTE_CODE}=1 in the worker's environment)")
    named = {"params": params, "model.base": cfg.model.base, "model.tokenizer": cfg.model.tokenizer,
             "model.warm_start": None if cfg.model.warm_start in ("off", "auto") else cfg.model.warm_start,
             "trainer.run_dir": cfg.trainer.run_dir, "sft.output": cfg.sft.output}
    for key, value in named.items():
        path = _local(value, project) if value else None
        if path is not None and not _inside(path, roots):
            problems.append(f"{key}={value} is outside the project {project} and the model cache {cache_root()} "
                            f"(allow a folder with {ALLOWED_ROOTS} in the worker's environment)")
    if problems:
        raise UntrustedParameters("this deployment run asks for what the worker does not allow:\n  - "
                                  + "\n  - ".join(problems))


def deployment_run() -> bool:
    """Whether the current flow run was triggered through a deployment (its parameters come from outside)."""
    from prefect.runtime import deployment

    return deployment.id is not None
