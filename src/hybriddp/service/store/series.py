"""Round series in the store: create, read, the round of a period, end (docs/SERIES.md).

A series is a schedule and a set of round parameters; each period gets one round (``rounds.series_num`` and
``rounds.period``, unique together). What runs when is decided by :mod:`hybriddp.service.series`; this module only
reads and writes. Creating a series and opening a period's round run under an advisory lock on PostgreSQL (SQLite
serializes writers), so two schedulers or two administrators racing cannot overlap two series or open a period twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import insert, select, text, update
from sqlalchemy.engine import Connection

from hybriddp.service import schema as s
from hybriddp.service.errors import ConflictError, NotFoundError
from hybriddp.service.store.engine import ADVISORY_SERIES
from hybriddp.service.store.rounds import _INFO_COLUMNS, ROUND_ID, RoundInfo, RoundStore, _info, new_round_id, now

SERIES_STATES = ("active", "ended", "cancelled")
"""A series is active until its last period's round is over (ended) or an administrator cancels it."""


def parse_time(value: str) -> datetime:
    """An ISO 8601 UTC time as stored (``now()``'s format)."""
    t = datetime.fromisoformat(value)
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class SeriesInfo:
    """A series' row: its schedule, its rounds' parameters and its state."""

    num: int
    id: str
    kind: str
    name: str | None
    params: dict[str, Any]
    start: str
    period_seconds: float
    optin_seconds: float
    periods: int
    flagged: str
    retention_hours: float
    state: str
    created: str
    carry: int = 0  # periods a record S selected stays on the next periods' head lists (ALGORITHM.md §13.1)
    admitted: dict[str, Any] | None = None  # periods per user, computed at creation (series.admitted_document)

    def period_start(self, k: int) -> datetime:
        """When period ``k`` (from 0) starts."""
        return parse_time(self.start) + timedelta(seconds=k * self.period_seconds)

    @property
    def end(self) -> datetime:
        """When the last period ends."""
        return self.period_start(self.periods)

    def period_at(self, t: datetime) -> int:
        """The period running at ``t`` (−1 before the start; ``periods`` or more after the end)."""
        return int((t - parse_time(self.start)).total_seconds() // self.period_seconds)

    def to_json(self, *, admin: bool = False) -> dict[str, Any]:
        params = dict(self.params)
        if not admin:
            params.pop("seed", None)
        return {"id": self.id, "kind": self.kind, "name": self.name, "params": params, "start": self.start,
                "end": self.end.isoformat(timespec="seconds"), "period_seconds": self.period_seconds,
                "optin_seconds": self.optin_seconds, "periods": self.periods, "flagged": self.flagged,
                "retention_hours": self.retention_hours, "state": self.state, "created": self.created,
                "carry": self.carry}


def _series(row: Any) -> SeriesInfo:
    return SeriesInfo(int(row.num), row.id, row.kind, row.name, json.loads(row.params), row.start,
                      float(row.period_seconds), float(row.optin_seconds), int(row.periods), row.flagged,
                      float(row.retention_hours), row.state, row.created, int(row.carry or 0),
                      None if row.admitted is None else json.loads(row.admitted))


class SeriesStore(RoundStore):
    """Series and the rounds of their periods."""

    def _lock_series(self, conn: Connection) -> None:
        if self.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ADVISORY_SERIES})

    def create_series(self, kind: str, name: str | None, params: dict[str, Any], *, start: datetime,
                      period_seconds: float, optin_seconds: float, periods: int, flagged: str,
                      retention_hours: float, first_round: str | None = None, carry: int = 0,
                      admitted: dict[str, Any] | None = None) -> SeriesInfo:
        """A new active series, or :class:`ConflictError` when an active series of the same kind overlaps it in time
        (devices find a kind's current round by its state: two series at once would make that ambiguous).

        ``first_round``: an existing round, of this kind and still collecting opt-in data, becomes period 0 (its
        parameters must be ``params``); any other round is refused with nothing changed. ``carry``: see
        :class:`SeriesInfo`; ``admitted``: the periods per user the series' status shows, computed by the caller."""
        sid = new_round_id()
        first = start.astimezone(timezone.utc)
        end = first + timedelta(seconds=periods * period_seconds)

        def run(conn: Connection) -> None:
            self._lock_series(conn)
            for row in conn.execute(select(s.series).where(s.series.c.kind == kind, s.series.c.state == "active")):
                other = _series(row)
                if parse_time(other.start) < end and first < other.end:
                    raise ConflictError(
                        f"the series' periods ({first.isoformat(timespec='seconds')} to "
                        f"{end.isoformat(timespec='seconds')}) overlap those of active {kind} series {other.id} "
                        f"({other.start} to {other.end.isoformat(timespec='seconds')}); start after it ends, or "
                        f"cancel it first (hybriddp series cancel {other.id})")
            adopted = None if first_round is None else self._adoptable(conn, first_round, kind)
            num = conn.execute(insert(s.series).values(
                id=sid, kind=kind, name=name, params=json.dumps(params, allow_nan=False),
                start=first.isoformat(timespec="seconds"), period_seconds=float(period_seconds),
                optin_seconds=float(optin_seconds), periods=int(periods), flagged=flagged,
                retention_hours=float(retention_hours), state="active", created=now(), carry=int(carry),
                admitted=None if admitted is None else json.dumps(admitted, allow_nan=False))
                .returning(s.series.c.num)).scalar_one()
            if adopted is not None:
                conn.execute(update(s.rounds).where(s.rounds.c.num == adopted.num).values(series_num=num, period=0))
        self._write(run)
        return self.series(sid)

    def _adoptable(self, conn: Connection, round_id: str, kind: str) -> RoundInfo:
        """The round that becomes a new series' first period, checked (see :meth:`create_series`)."""
        info = self._get(conn, round_id)
        if info.state != "collecting-optin":
            raise ConflictError(f"round {round_id} is {info.state!r}: a series can start with a round that is still "
                                "'collecting-optin' only (its head list comes from the first period's opt-in data); "
                                "leave --first-round out and the series opens its own first round")
        if info.kind != kind:
            raise ConflictError(f"round {round_id} is a {info.kind} round, the series is {kind}")
        taken = conn.execute(select(s.rounds.c.series_num).where(s.rounds.c.num == info.num)).scalar_one()
        if taken is not None:
            raise ConflictError(f"round {round_id} is a period of another series already")
        return info

    def _get_series(self, conn: Connection, series_id: str) -> SeriesInfo:
        row = None
        if ROUND_ID.fullmatch(series_id):
            row = conn.execute(select(s.series).where(s.series.c.id == series_id)).first()
        if row is None:
            raise NotFoundError(f"series {series_id[:40]!r} does not exist (a series id is 22 characters of URL-safe "
                                "base64); list them with GET /api/v1/series (administrator)")
        return _series(row)

    def series(self, series_id: str) -> SeriesInfo:
        """The series with this id, or :class:`NotFoundError`."""
        return self._read(lambda conn: self._get_series(conn, series_id))

    def series_list(self, state: str | None = None) -> list[SeriesInfo]:
        """Every series (in ``state``), oldest first."""
        q = select(s.series).order_by(s.series.c.num)
        if state is not None:
            q = q.where(s.series.c.state == state)
        return self._read(lambda conn: [_series(r) for r in conn.execute(q).all()])

    def series_rounds(self, series: SeriesInfo) -> dict[int, RoundInfo]:
        """The rounds of the series' periods so far, by period."""
        def run(conn: Connection) -> dict[int, RoundInfo]:
            rows = conn.execute(select(*_INFO_COLUMNS)
                                .where(s.rounds.c.series_num == series.num).order_by(s.rounds.c.period)).all()
            return {int(r.period): _info(r) for r in rows}
        return self._read(run)

    def open_period(self, series: SeriesInfo, period: int, name: str | None) -> tuple[RoundInfo, bool]:
        """(the round of ``period``, whether this call created it): created in state collecting-optin with the
        series' parameters unless it exists already."""
        rid = new_round_id()
        created = datetime.now(timezone.utc)
        deadline = (created + timedelta(hours=series.retention_hours)).isoformat(timespec="seconds")

        def run(conn: Connection) -> tuple[str, bool]:
            self._lock_series(conn)
            row = conn.execute(select(s.rounds.c.id).where(s.rounds.c.series_num == series.num,
                                                           s.rounds.c.period == period)).first()
            if row is not None:
                return row.id, False
            state = conn.execute(select(s.series.c.state).where(s.series.c.num == series.num)).scalar_one()
            if state != "active":
                raise ConflictError(f"series {series.id} is {state!r}: it opens no more rounds")
            conn.execute(insert(s.rounds).values(
                id=rid, kind=series.kind, name=name, state="collecting-optin",
                params=json.dumps(series.params, allow_nan=False), created=created.isoformat(timespec="seconds"),
                retention_deadline=deadline, series_num=series.num, period=period))
            return rid, True
        round_id, made = self._write(run)
        return self.round(round_id), made

    def end_series(self, series_id: str, to_state: str, from_states: tuple[str, ...] = ("active",)) -> SeriesInfo:
        """active → ``to_state`` (ended or cancelled); :class:`ConflictError` from any other state."""
        def run(conn: Connection) -> SeriesInfo:
            res = conn.execute(update(s.series).where(s.series.c.id == series_id,
                                                      s.series.c.state.in_(from_states)).values(state=to_state))
            info = self._get_series(conn, series_id)
            if res.rowcount != 1:
                raise ConflictError(f"series {series_id} is {info.state!r}; only an active series can be "
                                    f"{'cancelled' if to_state == 'cancelled' else 'ended'}")
            return info
        return self._write(run)

    def round_series(self, round_num: int) -> tuple[str, int] | None:
        """(series id, period) of a round that belongs to a series, else None."""
        row = self._read(lambda conn: conn.execute(
            select(s.series.c.id, s.rounds.c.period).join(s.series, s.series.c.num == s.rounds.c.series_num)
            .where(s.rounds.c.num == round_num)).first())
        return None if row is None else (row.id, int(row.period))
