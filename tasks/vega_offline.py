"""An HTML template for `dvc plots show` that renders offline: DVC's default page loads vega, vega-lite and
vega-embed from a CDN (a blank page without internet); this one carries the three scripts inline, taken from
their npm packages (``npm pack``, any npm registry or mirror). DVC finds it through ``plots.html_template``."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

# the majors DVC's templates are written for (vega-lite v5 schema), pinned for a reproducible page
PACKAGES = {"vega": "5.33.1", "vega-lite": "5.23.0", "vega-embed": "6.29.0"}
BUILD = {"vega": "package/build/vega.min.js", "vega-lite": "package/build/vega-lite.min.js",
         "vega-embed": "package/build/vega-embed.min.js"}


def page(scripts: dict[str, str]) -> str:
    """The page: scripts inline in order, then DVC's ``{plot_divs}`` placeholder (no ``{scripts}``, so DVC adds
    no CDN tags)."""
    for name, js in scripts.items():
        if "</script" in js.lower():
            raise ValueError(f"{name}: script text contains '</script', it cannot be inlined")
    inline = "\n".join(f"<script>/* {name} */\n{js}\n</script>" for name, js in scripts.items())
    return ("<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n{refresh_tag}\n<title>DVC plots</title>\n"
            f"{inline}\n<style>table {{ border-spacing: 15px; }}</style>\n</head>\n<body>\n{{plot_divs}}\n</body>\n"
            "</html>\n")


def fetch_scripts(cache: Path) -> dict[str, str]:
    """The minified builds of PACKAGES, from ``cache`` or ``npm pack`` into it."""
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, version in PACKAGES.items():
        js = cache / f"{name}-{version}.min.js"
        if not js.is_file():
            npm = shutil.which("npm")
            if npm is None:
                raise FileNotFoundError("npm is needed once to fetch vega/vega-lite/vega-embed for the offline "
                                        "plots page (apt install npm), or copy their .min.js into " + str(cache))
            with tempfile.TemporaryDirectory() as d:
                r = subprocess.run([npm, "pack", f"{name}@{version}", "--silent"], cwd=d, capture_output=True,
                                   text=True, timeout=300)
                if r.returncode != 0:
                    raise RuntimeError(f"npm pack {name}@{version} failed: {r.stderr.strip()[-500:]}")
                tgz = next(Path(d).glob("*.tgz"))
                with tarfile.open(tgz) as tar:
                    member = tar.extractfile(BUILD[name])
                    if member is None:
                        raise RuntimeError(f"{tgz.name} has no {BUILD[name]}")
                    js.write_bytes(member.read())
        out[name] = js.read_text(encoding="utf-8")
    return out


def write_template(out: Path, cache: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page(fetch_scripts(cache)), encoding="utf-8")
    return out


def default_cache() -> Path:
    return Path.home() / ".cache" / "ragen" / "vega"


def ensure_template(cache: Path | None = None) -> Path:
    """The offline page template, written once into ``cache`` (default ``~/.cache/ragen/vega``)."""
    cache = cache or default_cache()
    out = cache / f"dvc-plots-offline-{'-'.join(PACKAGES.values())}.html"
    return out if out.is_file() else write_template(out, cache)


def render_dvc_plots(repo: Path, out: Path, template: Path, timeout: float = 600) -> Path:
    """``dvc plots show`` of ``repo``'s dvc.yaml into ``out/index.html`` with the offline template (the DVC CLI
    beside this interpreter; a subprocess because DVC allows one command per repo at a time)."""
    import sys

    dvc = Path(sys.executable).with_name("dvc")
    cmd = [str(dvc) if dvc.is_file() else "dvc", "plots", "show", "--html-template", str(template.resolve()),
           "-o", str(out.resolve())]
    r = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"dvc plots show failed in {repo}: {(r.stderr or r.stdout).strip()[-2000:]}")
    page = out / "index.html"
    if not page.is_file():
        raise RuntimeError(f"dvc plots show wrote no {page}: {r.stdout.strip()[-500:]}")
    return page
