"""Planner statistics that keep up with fast-growing opt-in tables (PostgreSQL).

An opt-in round's tables grow from nothing to 10⁵ rows within minutes, faster than autovacuum's ANALYZE follows
(its naptime is a minute, its threshold 10% of the table). Planned on the statistics of a nearly empty table,
PostgreSQL scans ``optin_tokens`` whole for each lookup of an enrolment's "already enrolled" check, so enrolment
slowed from 10,582 users/s in a round of 10,000 to 1,188 in a round of 100,000 (docs/RESULTS.md "Issue 39"). The
store therefore runs ``ANALYZE`` of the opt-in tables itself whenever the rows it added since its last one are at
least as many as there were then (at least :data:`ANALYZE_MIN_ROWS`): a logarithmic number of times as a round
grows, ~0.1 s each at 10⁵ rows, and the statistics are never more than a factor of two behind. SQLite's planner
uses the indexes without statistics; nothing is run there.
"""

from __future__ import annotations

import threading

ANALYZE_MIN_ROWS = 1024
"""Rows added before the first ``ANALYZE`` of a store."""

OPTIN_TABLES = ("optin_tokens", "optin_uploads", "optin_records", "optin_values")
"""The tables :class:`GrowthStatistics` keeps analyzed."""


class GrowthStatistics:
    """Counts the rows added to the opt-in tables by this process and says when an ``ANALYZE`` is due."""

    def __init__(self, min_rows: int = ANALYZE_MIN_ROWS) -> None:
        self._lock = threading.Lock()
        self._min_rows = min_rows
        self._added = 0
        self._analyzed = 0

    def due(self, rows: int) -> bool:
        """Count ``rows`` added; True (once) when they, with those added since the last ``ANALYZE``, at least double
        what there was then."""
        with self._lock:
            self._added += max(0, rows)
            if self._added < max(self._min_rows, self._analyzed):
                return False
            self._analyzed += self._added
            self._added = 0
            return True

    @staticmethod
    def statement() -> str:
        """The ``ANALYZE`` of the opt-in tables (PostgreSQL)."""
        return "ANALYZE " + ", ".join(OPTIN_TABLES)
