"""Which flow runs LocalPrefect may mark Crashed when it starts (flows.serve.crash_orphans)."""

import subprocess

import pytest


@pytest.mark.unit
def test_a_flow_runs_process_counts_as_alive_until_it_has_ended():
    """LocalPrefect.crash_orphans marks a Running deployment run Crashed only when its process is gone."""
    import time

    from flows.serve import _alive

    p = subprocess.Popen(["sleep", "30"])
    assert _alive(str(p.pid))
    p.kill()
    t0 = time.monotonic()
    while _alive(str(p.pid)):  # a zombie (killed, not yet collected) has ended too
        assert time.monotonic() - t0 < 10
        time.sleep(0.05)
    p.wait()
    assert not _alive(str(p.pid)) and not _alive(None) and not _alive("host:12")
