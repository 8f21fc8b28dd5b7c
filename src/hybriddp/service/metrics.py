"""Prometheus metrics of the service (text exposition format 0.0.4, written here: no extra dependency).

Counters live in the process (they restart at 0 with the server, as Prometheus counters may);
rounds by state are read from the database at scrape time.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Request latency (and group commit time) histogram bounds, seconds."""
GROUP_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
"""Bounds of the histogram of report requests per group commit."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Metrics:
    """Report counters and request latencies, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reports = {"accepted": 0, "duplicate": 0, "refused": 0}
        self._latency: dict[tuple[str, str], list[float]] = {}  # (method, route) → bucket counts + [sum, count]
        self._commit = [0.0] * (len(BUCKETS) + 2)  # group commits: seconds
        self._group = [0.0] * (len(GROUP_BUCKETS) + 2)  # group commits: report requests

    def count_reports(self, accepted: int = 0, duplicate: int = 0, refused: int = 0) -> None:
        with self._lock:
            self.reports["accepted"] += accepted
            self.reports["duplicate"] += duplicate
            self.reports["refused"] += refused

    def observe(self, method: str, route: str, seconds: float) -> None:
        with self._lock:
            _add(self._latency.setdefault((method, route), [0.0] * (len(BUCKETS) + 2)), BUCKETS, seconds)

    def observe_group(self, requests: int, seconds: float) -> None:
        """One group commit of the report writer: how many requests it stored, and how long it took."""
        with self._lock:
            _add(self._commit, BUCKETS, seconds)
            _add(self._group, GROUP_BUCKETS, requests)

    def render(self, states: dict[str, int], all_states: tuple[str, ...]) -> str:
        """The exposition text."""
        out = ["# HELP hybriddp_rounds Rounds by state.", "# TYPE hybriddp_rounds gauge"]
        out += [f'hybriddp_rounds{{state="{s}"}} {states.get(s, 0)}' for s in all_states]
        out += ["# HELP hybriddp_reports_total Device messages: accepted (new), duplicate (retried id), refused.",
                "# TYPE hybriddp_reports_total counter"]
        with self._lock:
            out += [f'hybriddp_reports_total{{result="{k}"}} {v}' for k, v in self.reports.items()]
            out += ["# HELP hybriddp_request_duration_seconds Request latency by route.",
                    "# TYPE hybriddp_request_duration_seconds histogram"]
            for (method, route), h in sorted(self._latency.items()):
                out += _histogram("hybriddp_request_duration_seconds", f'method="{method}",route="{_escape(route)}",',
                                  BUCKETS, h)
            out += ["# HELP hybriddp_report_commit_seconds Time of one group commit of device reports (one "
                    "transaction, one fsync with SQLite).", "# TYPE hybriddp_report_commit_seconds histogram"]
            out += _histogram("hybriddp_report_commit_seconds", "", BUCKETS, self._commit)
            out += ["# HELP hybriddp_report_group_requests Report requests stored by one group commit.",
                    "# TYPE hybriddp_report_group_requests histogram"]
            out += _histogram("hybriddp_report_group_requests", "", GROUP_BUCKETS, self._group)
        return "\n".join(out) + "\n"


def _add(h: list[float], bounds: tuple[float, ...], value: float) -> None:
    """Count ``value`` in histogram ``h`` (per-bucket counts, then sum and count)."""
    i = bisect_left(bounds, value)
    if i < len(bounds):
        h[i] += 1
    h[-2] += value
    h[-1] += 1


def _histogram(name: str, labels: str, bounds: tuple[float, ...], h: list[float]) -> list[str]:
    """Exposition lines of one histogram: cumulative buckets, +Inf, sum, count. ``labels``: ``'a="x",'`` or ''."""
    lines, cum = [], 0.0
    for bound, n in zip(bounds, h, strict=False):
        cum += n
        lines.append(f'{name}_bucket{{{labels}le="{bound}"}} {int(cum)}')
    lines.append(f'{name}_bucket{{{labels}le="+Inf"}} {int(h[-1])}')
    bare = labels.rstrip(",")
    lines.append(f"{name}_sum{{{bare}}} {h[-2]:.6f}" if bare else f"{name}_sum {h[-2]:.6f}")
    lines.append(f"{name}_count{{{bare}}} {int(h[-1])}" if bare else f"{name}_count {int(h[-1])}")
    return lines


def _escape(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class LatencyMiddleware:
    """Pure ASGI middleware timing every HTTP request by its route template (not its URL: no ids)."""

    def __init__(self, app: Callable[..., Awaitable[None]], metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe(scope.get("method", ""), route, time.perf_counter() - start)
