"""The README and docs/ stay usable: the README short, every relative link and anchor resolving, every config key
described, and the generated key reference equal to the schema."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from ragen.config import Config
from ragen.config_reference import BEGIN, END, reference_markdown, refreshed

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
README_LIMIT = 12 * 1024
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped except '-' and '_', spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {anchor_of(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, frag = target.partition("#")
        dest = page if not path else (page.parent / path).resolve()
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{target} (no heading #{frag} in {dest.name})")
    return bad


def test_readme_is_short():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes (limit {README_LIMIT}): move detail into docs/"


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.name)
def test_links_resolve(page):
    assert not broken_links(page), f"{page.relative_to(ROOT)}: broken links {broken_links(page)}"


def test_link_check_catches_a_broken_link(tmp_path):
    page = tmp_path / "p.md"
    (tmp_path / "other.md").write_text("# A heading\n")
    page.write_text("[ok](other.md) [ok](other.md#a-heading) [gone](missing.md) [bad](other.md#nope) "
                    "[web](https://example.org)\n```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page) == ["missing.md (no such file)", "other.md#nope (no heading #nope in other.md)"]


def test_readme_indexes_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in readme]
    assert not missing, f"README.md's documentation index lacks {missing}"


def test_every_config_key_is_described():
    empty = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
            elif not (field.description or "").strip():
                empty.append(prefix + name)

    walk(Config, "")
    assert not empty, f"config keys without a description (add one in ragen/config.py): {empty}"


def test_configuration_reference_is_current():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert refreshed(page) == page, \
        "docs/configuration.md is stale: run `ragen config reference --write docs/configuration.md`"


def test_reference_lists_every_key_with_its_default():
    text = reference_markdown()
    assert "| `actor.clip_ratio_high` | float | `0.28` |" in text  # StarPO-S's clip-higher
    assert "| `envs.train.group_size` | int | `16` |" in text  # the paper's 8 x 16
    assert "| `algorithm.adv_estimator` | gae \\| grpo | `gae` |" in text
    assert text.count("\n| `") == sum(1 for line in text.splitlines() if line.startswith("| `"))


def test_refresh_needs_the_markers():
    with pytest.raises(ValueError, match="no generated block"):
        refreshed("# page without markers\n")
    assert refreshed(f"a\n{BEGIN}\nold\n{END}\nb\n") == f"a\n{BEGIN}\n{reference_markdown()}{END}\nb\n"


CITATION = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")
CITING = ("ragen", "cli", "flows", "tasks", "scripts", "infra")


def citations_in(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2) or "") for m in CITATION.finditer(text)]


def broken_citations(root: Path) -> list[str]:
    """Citations in the code and its settings that point at nothing: a docs page that does not exist, a heading it
    lacks, or a document users do not have (the maintainers' REFERENCE/DESIGN notes)."""
    files = [f for d in CITING for f in (root / d).rglob("*") if f.suffix in (".py", ".yaml", ".yml", ".json", ".sh")
             and "__pycache__" not in f.parts]
    files += [root / n for n in ("dvc.yaml", "params.yaml", "pyproject.toml", "Makefile") if (root / n).is_file()]
    bad = []
    for f in files:
        text = f.read_text(errors="replace")
        where = f.relative_to(root)
        if re.search(r"\bREFERENCE(\.md)?\s*[\d§]|\bDESIGN(\.md)?\b", text):
            bad.append(f"{where}: cites REFERENCE/DESIGN, which users do not have")
        for page, frag in citations_in(text):
            dest = root / "docs" / page
            if not dest.is_file():
                bad.append(f"{where}: docs/{page} does not exist")
            elif frag and frag not in anchors(dest):
                bad.append(f"{where}: docs/{page} has no heading #{frag}")
    return bad


def test_every_citation_in_the_code_points_at_a_page_users_have():
    assert not broken_citations(ROOT)


def test_the_citation_check_catches_what_points_at_nothing(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "algorithms.md").write_text("# Algorithms\n## The filter\n")
    (tmp_path / "ragen").mkdir()
    maintainers_notes = "REFER" + "ENCE 4.2, DESIGN.md"  # split so this file itself cites nothing
    (tmp_path / "ragen" / "a.py").write_text('"""See docs/algorithms.md#the-filter and docs/algorithms.md."""\n'
                                             f"# docs/gone.md, docs/algorithms.md#nope, {maintainers_notes}\n")
    assert broken_citations(tmp_path) == ["ragen/a.py: cites REFERENCE/DESIGN, which users do not have",
                                          "ragen/a.py: docs/gone.md does not exist",
                                          "ragen/a.py: docs/algorithms.md has no heading #nope"]
