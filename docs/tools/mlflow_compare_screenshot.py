"""Screenshot MLflow's compare view of grid runs, with chosen parallel-coordinates axes, in headless Chromium.

Used to make docs/img/mlflow-compare-*.png from a real grid. Not a project dependency: run it from a separate
environment with playwright (`pip install playwright`), against `make mlflow-ui` (or any MLflow server):

    python docs/tools/mlflow_compare_screenshot.py --url http://127.0.0.1:5000 --experiment-id 1 \
        --runs ID1,ID2,... --param tracking.tags.rollout_frequency \
        --metric panel/SimpleSokoban/success --metric panel/FrozenLake/success --out docs/img/x.png

Run ids: `sqlite3 mlflow.db "select run_uuid, name from runs"` or the MLflow UI.
"""

from __future__ import annotations

import argparse
import json

from playwright.sync_api import sync_playwright


def pick(page, box: int, names: list[str]) -> None:
    """Type each name into the box-th multi-select of the parallel-coordinates panel and choose it."""
    for name in names:
        field = page.locator("input.du-bois-light-select-selection-search-input").nth(box)
        field.click()
        field.fill(name)
        page.wait_for_timeout(600)
        page.keyboard.press("Enter")
        page.keyboard.press("Escape")
        page.wait_for_timeout(300)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:5000")
    ap.add_argument("--experiment-id", default="1")
    ap.add_argument("--runs", required=True, help="comma-separated run ids")
    ap.add_argument("--param", action="append", default=[], help="parallel-coordinates parameter axis")
    ap.add_argument("--metric", action="append", default=[], help="parallel-coordinates metric axis")
    ap.add_argument("--browser", default="/usr/bin/chromium")
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    runs = json.dumps(a.runs.split(","))
    url = f"{a.url}/#/compare-runs?runs={runs}&experiments={json.dumps([a.experiment_id])}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=a.browser, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1600, "height": a.height})
        page.goto(url)
        page.wait_for_selector("text=Parallel Coordinates Plot", timeout=60_000)
        page.wait_for_timeout(3000)
        close = page.locator("button[aria-label='Close']")  # the assistant side panel
        if close.count():
            close.first.click()
        page.get_by_role("button", name="Clear All").click()
        pick(page, 0, a.param)
        pick(page, 1, a.metric)
        page.mouse.click(5, 5)
        page.wait_for_timeout(2000)
        page.screenshot(path=a.out)
        browser.close()
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
