"""Splitting a log with times into periods (a round per period: ALGORITHM.md §13)."""

from __future__ import annotations

import datetime as dt

import numpy as np

from hybriddp.core.errors import DataError, parameter_error
from hybriddp.core.records import RecordLog

DAY = 86_400


def period_index(times: np.ndarray, start: int, seconds: int) -> np.ndarray:
    """The period of each time: ⌊(time − start) / seconds⌋ (negative before ``start``)."""
    return np.floor_divide(np.asarray(times, dtype=np.int64) - int(start), int(seconds))


def first_day(times: np.ndarray) -> int:
    """Midnight UTC of the earliest time's day: where :func:`split_periods` starts by default."""
    first = int(np.min(times))
    return first - first % DAY


def split_periods(log: RecordLog, seconds: int = 7 * DAY, start: int | None = None) -> list[tuple[str, RecordLog]]:
    """``(label, log)`` of every period from ``start`` (default: midnight UTC of the first record's day) to the last
    record, each ``seconds`` long; a period without records is an empty log. Labels are the periods' first days."""
    if log.times is None:
        raise DataError("this log has no times; load it with its QueryTime kept (load_aol(..., times=True))")
    if not (isinstance(seconds, (int, np.integer)) and seconds > 0):
        raise parameter_error("seconds", seconds, "a positive number of seconds (604800: a week)")
    if log.n_records == 0:
        return []
    start = first_day(log.times) if start is None else int(start)
    idx = period_index(log.times, start, seconds)
    out = []
    for t in range(max(int(idx.max()) + 1, 0)):
        label = dt.datetime.fromtimestamp(start + t * seconds, dt.timezone.utc).strftime("%Y-%m-%d")
        out.append((label, log.select(idx == t)))
    return out
