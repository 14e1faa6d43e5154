"""Run a short training loop in this process and print, as JSON, every TCP socket this process listens on at the
end (while its engine and process groups are still open): `python tests/run_sockets.py <run_dir> <--set>...`."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from listening import listening, socket_owners

from ragen.config import load_config
from ragen.run.loop import open_run, run_iteration


def main() -> None:
    run_dir, overrides = sys.argv[1], sys.argv[2:]
    before = set(listening())
    run, runtime, _ = open_run(load_config(None, ["cpu-small"], [f"trainer.run_dir={run_dir}", *overrides]),
                               "sockets")
    runtime.open()
    try:
        run_iteration(runtime, run, 0, 0)
        new = {i: a for i, a in listening().items() if i not in before}
        owners = socket_owners(set(new))
        print(json.dumps(sorted({f"{a}:{p}" for i, (a, p) in new.items() if owners.get(i) == os.getpid()})))
    finally:
        runtime.close()


if __name__ == "__main__":
    main()
