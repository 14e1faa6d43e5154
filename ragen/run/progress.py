"""One line per completed iteration, for long runs that would otherwise print nothing until they end (the learning
bench on stderr, `ragen up` while the deployment's flow run trains in the worker's process)."""

from __future__ import annotations

from ragen.run.rundir import MARKER, RunDir


def tag_values(m: dict[str, float], split: str, name: str = "success") -> list[float]:
    """``{split}/<tag>/<name>`` of each tag (not the all/* mean of a panel)."""
    return [v for key, v in m.items() if key.startswith(f"{split}/") and key.endswith(f"/{name}")
            and key.count("/") == 2 and key != f"{split}/all/{name}"]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def iteration_line(k: int, m: dict[str, float], last: int) -> str:
    """``iteration 3/10: train success 0.250, panel success 0.400, format errors 2.0%, 52 s (update 31 s)``."""
    train, val = tag_values(m, "train"), tag_values(m, "val")
    errors = tag_values(m, "train", "format_error_rate")
    parts = [f"train success {_mean(train):.3f}"] if train else []
    parts += [f"panel success {_mean(val):.3f}"] if val else []
    parts += [f"format errors {100 * _mean(errors):.1f}%"] if errors else []
    parts.append(f"{m.get('timing_s/iteration', 0.0):.0f} s (update {m.get('timing_s/step', 0.0):.0f} s)")
    return f"iteration {k + 1}/{last + 1}: " + ", ".join(parts)


def time_left(seconds_per_iteration: list[float], done: int, total: int) -> str:
    """``about 12 min left`` from the mean of the iterations timed so far ('' before any)."""
    if not seconds_per_iteration or done >= total:
        return ""
    left = _mean(seconds_per_iteration) * (total - done)
    return f"about {left / 60:.0f} min left" if left >= 180 else f"about {left:.0f} s left"


class RunWatcher:
    """Reads a run directory that another process trains and returns a line for each iteration completed since
    the last look (those completed before the watcher started are not repeated)."""

    def __init__(self, run: RunDir, total: int) -> None:
        self.run, self.last = run, total - 1
        self.seen = set(self._done())
        self.timings: list[float] = []

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
                m = self.run.metrics(key[0])
                if "timing_s/iteration" in m:
                    self.timings.append(m["timing_s/iteration"])
                eta = time_left(self.timings, key[0] + 1, self.last + 1)
                lines.append(iteration_line(key[0], m, self.last) + (f", {eta}" if eta else ""))
        return lines
