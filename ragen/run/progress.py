"""One line per completed iteration, for long runs that would otherwise print nothing until they end (the learning
bench on stderr, `ragen up` while the deployment's flow run trains in the worker's process)."""

from __future__ import annotations

from ragen.run.rundir import MARKER, RunDir


def tag_successes(m: dict[str, float], split: str) -> list[float]:
    """``{split}/<tag>/success`` of each tag (not the all/* mean of a panel)."""
    return [v for key, v in m.items() if key.startswith(f"{split}/") and key.endswith("/success")
            and key.count("/") == 2 and key != f"{split}/all/success"]


def iteration_line(k: int, m: dict[str, float], last: int) -> str:
    """``iteration 3/10: train success 0.250, panel success 0.400, 52 s (update 31 s)``."""
    train, val = tag_successes(m, "train"), tag_successes(m, "val")
    parts = [f"train success {sum(train) / len(train):.3f}"] if train else []
    parts += [f"panel success {sum(val) / len(val):.3f}"] if val else []
    parts.append(f"{m.get('timing_s/iteration', 0.0):.0f} s (update {m.get('timing_s/step', 0.0):.0f} s)")
    return f"iteration {k + 1}/{last + 1}: " + ", ".join(parts)


class RunWatcher:
    """Reads a run directory that another process trains and returns a line for each iteration completed since
    the last look (those completed before the watcher started are not repeated)."""

    def __init__(self, run: RunDir, total: int) -> None:
        self.run, self.last = run, total - 1
        self.seen = set(self._done())

    def _done(self) -> list[tuple[int, int]]:
        """(iteration, its marker's mtime): an iteration the collapse guard rolled back and trained again is new."""
        out = []
        for k in self.run.completed():
            try:
                out.append((k, (self.run.iteration(k) / MARKER).stat().st_mtime_ns))
            except FileNotFoundError:  # rolled back between the listing and the look
                continue
        return out

    def new_lines(self) -> list[str]:
        lines = []
        for key in self._done():
            if key not in self.seen:
                self.seen.add(key)
                lines.append(iteration_line(key[0], self.run.metrics(key[0]), self.last))
        return lines
