"""The fault bench: runs the project's fault-injection suite (tests/faults) and counts what survived. It runs
pytest on a source checkout, so it lives with the command line, not in the library."""

from __future__ import annotations

import time


def bench_faults(*, quick: bool = False, pytest_args: tuple[str, ...] = ()) -> dict:
    """Run the fault-injection suite (tests/faults of the project checkout) and return its counts: faults tried
    by kind (real, simulated; bad inputs apart), not tried, survived, distinct guarded files and those lost.
    ``quick`` leaves out the cases that train (slow)."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    suite = Path(__file__).resolve().parents[1] / "tests" / "faults"
    if not suite.is_dir():
        raise FileNotFoundError(f"{suite} not found: `ragen bench faults` runs the project's test suite, so it "
                                f"needs a source checkout (git clone), not an installed wheel")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "faults.json"
        env = dict(os.environ, RAGEN_FAULTS_JSON=str(out))
        cmd = [sys.executable, "-m", "pytest", str(suite), "-q", "-p", "no:cacheprovider",
               *(["-m", "not slow"] if quick else []), *pytest_args]
        t0 = time.monotonic()
        # pytest's own report goes to stderr, so stdout stays one JSON object
        r = subprocess.run(cmd, cwd=suite.parents[1], env=env, stdout=sys.stderr, stderr=sys.stderr)
        counts = json.loads(out.read_text()) if out.is_file() else {
            "faults_tried": 0, "real": 0, "simulated": 0, "input": 0, "not_tried": 0, "survived": 0,
            "inputs_refused": 0, "data_lost": 0, "guarded_files": 0, "faults": []}
    return {**counts, "pytest_exit_code": r.returncode, "wall_s": round(time.monotonic() - t0, 1),
            "quick": quick}
