"""Every command line in README.md and docs/*.md names something that exists: a `ragen` line parses against the
command line as it is (its commands, options and their values, without running it), a `make` line names a
Makefile target, a `dvc repro` line a stage of dvc.yaml, a `prefect deployment run` line a deployment of
infra/prefect/prefect.yaml, and a file a line reads exists on a fresh clone or is made by a line before it. A new
line is checked as it is written: there is no list of lines to keep up to date."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
import yaml

# typer >= 0.26 carries its own click (typer._click): its commands and errors are those classes
from typer._click.core import Context
from typer._click.exceptions import UsageError

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"```(?:bash|sh|shell|console)?\n(.*?)```", re.S)
TOOLS = ("ragen", "make", "dvc", "prefect", "torchrun")
OPTIONAL = re.compile(r"\s\[(--[^\]]*)\]")  # `[--engine vllm]`: an optional part, shown in brackets


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def command_lines(page: Path) -> list[tuple[str, list[str]]]:
    """(where, words) of each line of a shell block that runs one of ``TOOLS``: comments, optional parts in
    brackets and output redirections left out."""
    out = []
    for block in FENCE.findall(page.read_text()):
        for line in block.splitlines():
            if not re.match(rf"\s*(\.venv/bin/)?({'|'.join(TOOLS)})\s", line):
                continue
            words = shlex.split(OPTIONAL.sub("", line), comments=True)
            words[0] = words[0].removeprefix(".venv/bin/")
            cut = next((i for i, w in enumerate(words) if w in (">", "|", "&&", ";")), len(words))
            out.append((f"{page.relative_to(ROOT)}: {line.strip()[:100]}", words[:cut]))
    return out


ALL = [c for page in doc_pages() for c in command_lines(page)]


def ragen_words(words: list[str]) -> list[str]:
    """The arguments after `ragen` (under torchrun: after the program `$(which ragen)`)."""
    if words[0] == "torchrun":
        return words[words.index("train"):]
    return words[1:]


def parse(args: list[str]) -> Context:
    """Parse ``ragen args`` as the command line would, down to the command, without running it."""
    from cli.main import app

    command = typer.main.get_command(app)
    ctx = command.make_context("ragen", list(args), resilient_parsing=False)
    while hasattr(command, "resolve_command"):  # a group
        protected = getattr(ctx, "_protected_args", None)  # click 8.2+; `protected_args` before
        rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
        if not rest:
            break
        name, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None, f"no command {name!r}"
        ctx, command = sub.make_context(name, rest, parent=ctx), sub
    return ctx


def made_before(path: str, where: str) -> bool:
    """Whether a line before ``where`` on its page writes ``path`` (``--out FILE``)."""
    page = where.split(":")[0]
    before = [w for at, w in ALL[:[at for at, _ in ALL].index(where)] if at.startswith(f"{page}:")]
    return any("--out" in w and w[w.index("--out") + 1:w.index("--out") + 2] == [path] for w in before)


def unread_files(where: str, ctx: Context) -> list[str]:
    """The files a parsed line reads (--params, --panel) that a fresh clone lacks and no line before it makes."""
    values = [ctx.params.get(name) for name in ("params", "panel")]
    return [str(v) for v in values if v is not None and not (ROOT / str(v)).exists() and not made_before(str(v),
                                                                                                           where)]


@pytest.mark.parametrize("where,words", [c for c in ALL if c[1][0] in ("ragen", "torchrun")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_ragen_line_parses(where, words):
    args = ragen_words(words)
    try:
        ctx = parse(args)
    except UsageError as e:
        pytest.fail(f"{where}: {e.format_message()}")
    assert not unread_files(where, ctx), f"{where}: reads {unread_files(where, ctx)}, which a fresh clone lacks " \
                                         f"and no line before it on the page makes (--out FILE)"


def test_the_parser_sees_an_unknown_option_and_command():
    with pytest.raises(UsageError, match="No such option"):
        parse(["train", "--no-such-option"])
    with pytest.raises(UsageError, match="No such command"):
        parse(["bench", "nothing"])
    assert parse(["bench", "learn", "--json", "--iterations", "4"]).params["iterations"] == 4


@pytest.mark.parametrize("where,words", [c for c in ALL if c[1][0] == "make"], ids=lambda v: v if isinstance(
    v, str) else "")
def test_a_make_line_names_a_target(where, words):
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    wanted = [w for w in words[1:] if "=" not in w]
    assert wanted and set(wanted) <= targets, f"{where}: no Makefile target {set(wanted) - targets}"


@pytest.mark.parametrize("where,words", [c for c in ALL if c[1][:2] == ["dvc", "repro"]], ids=lambda v: v if
                         isinstance(v, str) else "")
def test_a_dvc_repro_line_names_a_stage(where, words):
    stages = set(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
    assert set(words[2:]) <= stages, f"{where}: no dvc.yaml stage {set(words[2:]) - stages}"


@pytest.mark.parametrize("where,words", [c for c in ALL if c[1][:3] == ["prefect", "deployment", "run"]],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_prefect_line_names_a_deployment(where, words):
    assert words[3] in deployments(), f"{where}: no deployment {words[3]!r} in infra/prefect/prefect.yaml"


def deployments() -> set[str]:
    """``flow/deployment`` of each deployment in infra/prefect/prefect.yaml (the flow's name from its ``@flow``)."""
    spec = yaml.safe_load((ROOT / "infra" / "prefect" / "prefect.yaml").read_text())
    out = set()
    for d in spec["deployments"]:
        path, func = d["entrypoint"].split(":")
        found = re.search(rf'@flow\(name="([^"]+)"[^\n]*\n(?:@.*\n)*def {func}\(', (ROOT / path).read_text())
        assert found, f"{d['entrypoint']}: no @flow(name=...) over def {func}"
        out.add(f"{found.group(1)}/{d['name']}")
    return out


def test_the_docs_have_command_lines_of_every_kind():
    kinds = {w[0] for _, w in ALL}
    assert kinds == set(TOOLS) and len(ALL) > 60, kinds


def trained_config(ctx: Context):
    """The config a `ragen train` or `ragen bench learn` line trains with, resolved as the command resolves it;
    None for other commands."""
    from cli.bench import learn_sources
    from ragen.config import load_config
    from ragen.experiments import experiment_settings
    from ragen.run.loop import with_iterations

    p = ctx.params
    name = f"{ctx.parent.info_name} {ctx.info_name}" if ctx.parent and ctx.parent.parent else ctx.info_name
    if name not in ("train", "bench learn") or p.get("redraw") or p.get("resume"):
        return None
    if p.get("experiment"):
        r = experiment_settings(p["experiment"], p.get("scale") or "cpu-small", 0, p.get("overrides") or [])
        return load_config(None, list(r.presets), list(r.overrides))
    params, preset = (p.get("params"), p.get("preset"))
    if name == "bench learn":
        params, preset = learn_sources(params, preset)
    return load_config(params, preset or [], with_iterations(p.get("overrides") or [], p.get("iterations")))


TRAINING = [c for c in ALL if c[1][0] == "torchrun" or c[1][:2] == ["ragen", "train"]
            or c[1][:3] == ["ragen", "bench", "learn"]]


@pytest.mark.parametrize("where,words", TRAINING, ids=lambda v: v if isinstance(v, str) else "")
def test_a_training_line_trains_the_model_it_is_meant_for(where, words, monkeypatch):
    """The bundled SmolLM2 unless the line asks for the paper's scale: a line that silently falls back to the
    schema's defaults trains Qwen2.5-0.5B, which this machine cannot fetch."""
    monkeypatch.chdir(ROOT)
    cfg = trained_config(parse(ragen_words(words)))
    if cfg is None:
        return
    paper = "paper" in (cfg.preset or []) or ("--scale" in words and words[words.index("--scale") + 1] == "paper")
    assert (cfg.model.base != "smollm2-135m-instruct") == paper, f"{where}: trains {cfg.model.base}"


def test_the_checks_see_a_line_without_settings_and_a_file_nothing_makes(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert trained_config(parse(["train", "--run", "x"])).model.base != "smollm2-135m-instruct"
    assert trained_config(parse(["bench", "learn", "--json"])).model.base == "smollm2-135m-instruct"  # params.yaml
    where = ALL[0][0]
    assert unread_files(where, parse(["eval", "--checkpoint", "runs/x", "--panel", "nowhere.json"])) == [
        "nowhere.json"]
