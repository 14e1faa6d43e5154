"""What a run triggered through a deployment may ask for. Whoever can trigger a deployment (``ragen/train-loop``,
``ragen-sft/sft``, or any flow served later) chooses its parameters, and the worker carries them out with its own
rights. Every flow a deployment can start is wrapped by ``gated``: in a deployment run it checks the parameters
before any file is parsed, then the resolved config before anything loads, and refuses, unless the worker's own
environment allows them:

- ``model.trust_remote_code`` executes the model repository's Python on the worker: ``RAGEN_ALLOW_REMOTE_CODE=1``;
- local paths outside the project and the model cache: the params file, models read (``model.base``,
  ``model.tokenizer``, ``model.warm_start``), panels read (``eval.panel``), outputs written (``trainer.run_dir``,
  ``sft.output``, a flow's output folders): extra roots in ``RAGEN_ALLOWED_ROOTS`` (separated by ``os.pathsep``);
- an MLflow tracking URI or artifact location other than the worker's own (its project's params file) that is not
  a local path inside those roots: weights and metrics would leave the machine;
- a preset that is not one of the package's (a name, never a path).

A hub id (``org/name`` that is no local path) stays allowed: with remote code off it loads weights, not code.
``ragen train`` and the Python API run as their caller, who is trusted: nothing here applies to them."""

from __future__ import annotations

import functools
import inspect
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ragen.config import Config, available_presets, load_config
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


def _local_uri_path(uri: str | None, project: Path) -> Path | None:
    """The local file or folder an MLflow URI or location names (sqlite:///, file:, a plain path); None for a
    remote one (http://, s3://, postgresql://, ...)."""
    if not uri:
        return None
    for prefix in ("sqlite:///", "file://", "file:"):
        if uri.startswith(prefix):
            return _local(uri[len(prefix):] or ".", project)
    return None if "://" in uri else _local(uri, project)


def worker_tracking(project: Path) -> tuple[str, str | None]:
    """The worker's own MLflow tracking URI and artifact location: its project's params file (the defaults when
    it has none)."""
    own = project / "params.yaml"
    t = load_config(own if own.is_file() else None).tracking
    return t.mlflow_tracking_uri, t.mlflow_artifact_location


def _parameter_problems(params: str | None, presets: Iterable[str], paths: dict[str, str | None] | None,
                        project: Path) -> list[str]:
    """What a deployment run names before any file is parsed: the params file and other paths (outputs, inputs)
    inside the allowed roots, packaged preset names only."""
    problems = _outside({"params": params, **(paths or {})}, project, allowed_roots(project))
    known = available_presets()
    return problems + [f"preset {p!r} is not one of the package's presets ({', '.join(known)})"
                       for p in presets if p not in known]


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
             "trainer.run_dir": cfg.trainer.run_dir, "sft.output": cfg.sft.output, "eval.panel": cfg.eval.panel}
    problems += _outside(named, project, roots)
    own_uri, own_artifacts = worker_tracking(project)
    t = cfg.tracking
    for key, value, own in (("tracking.mlflow_tracking_uri", t.mlflow_tracking_uri, own_uri),
                            ("tracking.mlflow_artifact_location", t.mlflow_artifact_location, own_artifacts)):
        problems += _foreign_tracking(key, value, own, project, roots)
    _refuse(problems)


def _foreign_tracking(key: str, value: str | None, own: str | None, project: Path, roots: list[Path]) -> list[str]:
    """A tracking destination other than the worker's own, unless it is a local path inside the roots."""
    local = _local_uri_path(value, project)
    if value == own or (local is not None and _inside(local, roots)):
        return []
    return [f"{key}={value} is not this worker's own ({own}) nor a local path inside the project or "
            f"{ALLOWED_ROOTS}: the run's metrics and weights would go there"]


def _outside(named: dict[str, str | None], project: Path, roots: list[Path]) -> list[str]:
    problems = []
    for key, value in named.items():
        path = _local(value, project) if value else None
        if path is not None and not _inside(path, roots):
            problems.append(f"{key}={value} is outside the project {project} and the model cache {cache_root()} "
                            f"(allow a folder with {ALLOWED_ROOTS} in the worker's environment)")
    return problems


def _refuse(problems: list[str]) -> None:
    if problems:
        raise UntrustedParameters("this deployment run asks for what the worker does not allow:\n  - "
                                  + "\n  - ".join(problems))


# a gated flow's parameters that name paths it reads or writes (checked against the allowed roots)
PATH_ARGS = ("out", "reports", "export", "checkpoint", "outs")


def gated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a flow's function (under ``@flow``): in a deployment run, its parameters are checked before any file
    is parsed (``_parameter_problems``), then the config they resolve to (``check_deployment_config``; a ``cfg``
    parameter is checked as given). Outside a deployment run it is the function itself."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if deployment_run():
            check_flow_arguments(sig.bind(*args, **kwargs).arguments)
        return fn(*args, **kwargs)

    wrapper.gated = True  # type: ignore[attr-defined]
    return wrapper


def check_flow_arguments(a: dict[str, Any], project: str | Path = ".") -> None:
    """The deployment checks for one flow call's arguments by name (``gated``)."""
    presets = a.get("preset") or []
    presets = [presets] if isinstance(presets, str) else list(presets)
    paths: dict[str, str | None] = {}
    for name in PATH_ARGS:
        value = a.get(name)
        for i, v in enumerate(value if isinstance(value, list | tuple) else [value]):
            if v is not None:
                paths[name if not isinstance(value, list | tuple) else f"{name}[{i}]"] = str(v)
    root = Path(project).resolve()
    problems = _parameter_problems(a.get("params"), presets, paths, root)
    if a.get("tracking_uri") is not None:
        problems += _foreign_tracking("tracking_uri", a["tracking_uri"], worker_tracking(root)[0], root,
                                      allowed_roots(root))
    _refuse(problems)
    cfg = a.get("cfg")
    if cfg is None and "preset" in a:  # a flow of params file <- presets <- overrides
        cfg = load_config(a.get("params"), presets, list(a.get("overrides") or []))
    if isinstance(cfg, Config):
        check_deployment_config(cfg, a.get("params"), project)


def deployment_run() -> bool:
    """Whether the current flow run was triggered through a deployment (its parameters come from outside)."""
    from prefect.runtime import deployment

    return deployment.id is not None
