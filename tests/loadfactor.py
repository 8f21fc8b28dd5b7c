"""How busy the machine is right now, for tests whose premise is a wall-clock window (docs/TESTING.md "On a busy
machine").

:func:`slowdown` runs a fixed CPU-bound pure-Python loop on one thread and returns its wall time over the CPU time
the process spent on it: about 1 on an idle machine, about 2 when every core has another runnable process (two
``yes > /dev/null`` and two test workers on two cores). It compares the machine with itself at that moment, so it
needs no reference figure from another machine. A test scales a window it must fit its work into by it.
"""

from __future__ import annotations

import time

PROBE_STEPS = 300_000
"""Iterations of the probe: about 50 ms of CPU on a 2020s core."""
MAX_SLOWDOWN = 6.0


def slowdown(repeats: int = 3) -> float:
    """Wall time over process CPU time of the probe, the median of ``repeats`` runs, at least 1, at most
    :data:`MAX_SLOWDOWN`. Call it before starting the test's own threads (their CPU time would count)."""
    ratios = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        acc = 0
        for i in range(PROBE_STEPS):
            acc = (acc * 31 + i) & 0xFFFF
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        ratios.append(wall / cpu if cpu > 0 else 1.0)
    return min(max(sorted(ratios)[len(ratios) // 2], 1.0), MAX_SLOWDOWN)
