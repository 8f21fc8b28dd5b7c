"""``experiment trends`` on a real log with times (an AOL-format file with QueryTime; ALGORITHM.md §13).

The log is cut into periods (:func:`hybriddp.core.periods.split_periods`, weekly by default) and its own per-period
query shares are the truth, exactly: a query's *popularity* in a period is its share of that period's records.
* Recall counts the changes by at least ``1 + truth_change`` (issue 30: 50%) between consecutive periods among the
  ``head_queries`` most frequent queries of the whole log (a rare query's share jumps by chance).
* Precision counts a reported trend as correct when its query's share did move that way by at least the test's own
  boundary (``1 + min_change``) within ``window − 1`` periods: on real data every query drifts a little, and the test
  claims no more than that.
* Participation 1/r: each user draws one slot in 0 … r − 1 and takes part in the periods t with t mod r = slot.
* The log without drift is the same log with every user moved, whole, to a uniformly random period: every period
  then has the same law, and each reported trend is a false discovery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hybriddp.core.errors import DataError
from hybriddp.core.periods import first_day, period_index, split_periods
from hybriddp.core.records import RecordLog
from hybriddp.core.rng import make_rng


@dataclass
class RealTruth:
    """What a real log's periods say changed (module docstring)."""

    changes: set[tuple[str, int, str]]  # recall's truth: (query, t, "rising" | "falling"), t from 1
    shares: list[np.ndarray]  # per period: each query's share of the period's records (by query code)
    code: Callable[[str], int]  # a query's code in the log (−1: not in it)
    window: int
    boundary: float  # 1 + the test's min_change

    def confirms(self, found: tuple[str, int, str]) -> bool:
        """Whether a reported trend is real: its query's share moved its way by at least the boundary within the
        window."""
        name, t, way = found
        q = self.code(name)
        if q < 0:
            return False
        for u in range(max(1, t - self.window + 1), min(len(self.shares), t + self.window)):
            if not (self.shares[u - 1].any() and self.shares[u].any()):  # an empty period says nothing
                continue
            before, after = float(self.shares[u - 1][q]), float(self.shares[u][q])
            if way == "rising" and after > before and after >= self.boundary * before:
                return True
            if way == "falling" and after < before and after * self.boundary <= before:
                return True
        return False


NO_TRUTH = RealTruth(set(), [], lambda name: -1, 1, 1.0)
"""The log without drift: nothing changed, so nothing reported is confirmed."""


class RealLog:
    """A real log with times, cut into ``periods`` periods of ``seconds`` (the first ones it has)."""

    def __init__(self, log: RecordLog, periods: int, seconds: int) -> None:
        cut = split_periods(log, seconds)
        if len(cut) < 2:
            length = f"{seconds / 86400:g} day(s)" if seconds >= 86400 else f"{seconds / 3600:g} hour(s)"
            raise DataError(f"the log spans {len(cut)} period(s) of {length}; trends need at least two: give a log "
                            "over a longer time, or shorter periods (--period)")
        self.logs = [part for _, part in cut[:periods]]
        assert log.times is not None  # split_periods refused a log without times
        self.log = log.select(period_index(log.times, first_day(log.times), seconds) < len(self.logs))

    @classmethod
    def load(cls, path: str, periods: int, seconds: int) -> RealLog:
        """Load an AOL-format file with its QueryTime (:func:`hybriddp.io.aol.load_aol`)."""
        from hybriddp.io.aol import load_aol
        return cls(load_aol(path, times=True), periods, seconds)

    @property
    def n_periods(self) -> int:
        return len(self.logs)

    def periods(self, r: int, drifting: bool, seed: int) -> list[RecordLog]:
        """Each period's log as its users under participation 1/``r`` (module docstring) see it; without drift,
        the log with every user in a random period."""
        rng = make_rng(seed)
        if drifting:
            logs = self.logs
        else:
            home = rng.integers(0, self.n_periods, size=self.log.n_users)[self.log.record_users()]
            logs = [self.log.select(home == t) for t in range(self.n_periods)]
        if r == 1:
            return logs
        out = []
        slot_of: dict[str, int] = {}
        for t, part in enumerate(logs):
            keys = part.user_keys(np.arange(part.n_users))
            draws = rng.integers(0, r, size=len(keys))
            slots = np.array([slot_of.setdefault(k, int(d)) for k, d in zip(keys, draws.tolist(), strict=True)])
            out.append(part.select(slots[part.record_users()] == t % r))
        return out

    def truth(self, head_queries: int, truth_change: float, min_change: float, window: int) -> RealTruth:
        """The changes among the ``head_queries`` most frequent queries, and every period's shares of every query
        (for precision)."""
        counts = [np.bincount(part.query, minlength=len(part.queries)) for part in self.logs]
        total = np.sum(counts, axis=0)
        head = np.argsort(-total, kind="stable")[:head_queries]
        head = head[total[head] > 0]
        names = self.log.queries.decode(head)
        shares = [c / max(int(c.sum()), 1) for c in counts]
        changes: set[tuple[str, int, str]] = set()
        up = 1.0 + truth_change
        for t in range(1, self.n_periods):
            if not (counts[t - 1].any() and counts[t].any()):  # a period without records: no change to count
                continue
            before, after = shares[t - 1][head], shares[t][head]
            for name, b, a in zip(names, before.tolist(), after.tolist(), strict=True):
                if a > 0 and a >= up * b:
                    changes.add((name, t, "rising"))
                elif b > 0 and a * up <= b:
                    changes.add((name, t, "falling"))
        vocab = self.log.queries
        return RealTruth(changes, shares, lambda name: int(vocab.encode([name])[0]), window, 1.0 + min_change)

