"""Round series: one round per period, opened, published and closed on schedule (docs/SERIES.md; issue 30).

A series holds a kind, the rounds' parameters and a schedule: period k runs from start + k·P to start + (k + 1)·P.
Its round is opened when the period starts and takes opt-in data for the first ``optin_seconds``; then its head
list is built from that period's opt-in data (the opt-in users are charged then, as every round's are) and devices
report until the period ends, when the round is closed and its results published (or held when the anchor check
flags them, as the series says). :func:`advance` does whatever the clock says is due and nothing else, so it is
safe to call from any number of schedulers (the server's own thread, an operator's cron) at any time: every action
is a conditional state transition in the store, and a period's round is created once (a unique index).

Spend carries across rounds by construction: the ledger charges each opt-in user's pseudonym per round against the
database's lifetime budget, and a user whose charge for the period would exceed it is refused at enrolment.
Devices keep their own ledger (:class:`hybriddp.device.ledger.DeviceLedger`): the server cannot link a device's
reports across rounds, by design.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from hybriddp.core.errors import DataError, HybridDPError, parameter_error
from hybriddp.service import closing, roundparams, rounds
from hybriddp.service.errors import ConflictError
from hybriddp.service.store import MAX_RETENTION_HOURS, REPORT_STATES, RoundInfo, SeriesInfo, Store

logger = logging.getLogger(__name__)

MIN_PERIOD_SECONDS = 1.0
"""Shortest period (tests and demos run seconds-long periods; a deployment runs days or weeks)."""
MAX_PERIODS = 1000
ON_FLAG = closing.ON_FLAG
DEFAULT_TICK_SECONDS = 30.0
"""How often ``hybriddp serve`` runs :func:`advance_all` (``--series-tick``)."""
MIN_REPORT_PHASE_SECONDS = 600.0
"""Shortest time a period may leave after its opt-in window (period − opt-in window): the round's issuance and
report windows must fit in it, and the close keeps a tenth of it (:data:`rounds.REPORT_SLACK`, here at least 60 s:
two runs of the scheduler at its default tick) for a device whose report is still in flight. With less, the round
closes while devices are still reporting, and they get 409. The rule (docs/SERIES.md):
``period − opt-in window ≥ max(600 s, (issuance window + report window) / 0.9)``; below 600 s is refused, and
between the two the windows are shrunk in proportion to fit, which :func:`schedule_warnings` says."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str, field: str) -> float:
    """Seconds of ``90``, ``90s``, ``15m``, ``12h``, ``7d`` or ``1w``; a ParameterError naming ``field`` otherwise."""
    m = _DURATION.match(str(text))
    if m is None:
        raise parameter_error(field, text, "a duration: a number with an optional unit s, m, h, d or w",
                              "E.g. 7d for weekly periods, 12h, 90 (seconds).")
    return float(m.group(1)) * _UNIT[m.group(2)]


@dataclass(frozen=True)
class SeriesPlan:
    """A series as an administrator asked for it, checked (:func:`plan_series`)."""

    kind: str
    name: str | None
    params: dict[str, Any]
    start: datetime
    period_seconds: float
    optin_seconds: float
    periods: int
    flagged: str
    retention_hours: float
    carry: int  # periods a record S selected stays on the next periods' head lists (ALGORITHM.md §13.1)
    admitted: dict[str, Any]  # periods per user under the lifetime budget (:func:`admitted_document`)


def plan_series(store: Store, kind: str, params: dict[str, Any], *, name: str | None = None,
                start: datetime | None = None, period_seconds: float, optin_seconds: float | None = None,
                periods: int, flagged: str = "hold", retention_hours: float | None = None,
                carry: int | None = None, at: datetime | None = None) -> SeriesPlan:
    """Check a series before it is stored; every refusal names the field, the value and the fix.

    ``optin_seconds`` defaults to half the period; ``retention_hours`` (how long a period's raw opt-in data may be
    kept at most) to the period's length in hours, at least one; ``start`` to now. Refused: a period shorter than
    :data:`MIN_PERIOD_SECONDS`, an opt-in window that leaves no time for reports, a period that leaves less than
    :data:`MIN_REPORT_PHASE_SECONDS` after its opt-in window (its round would close while devices report), a start
    more than one period in the past, a retention shorter than the opt-in window (the purge would abort every round
    before its head list), a carry (``carry``, default :data:`~hybriddp.curator.carry.DEFAULT_CARRY` for BLENDER, 0
    for means) that a mean series or an estimator without S's released counts cannot use, and a round whose (ε, δ)
    alone exceeds the lifetime budget (the budget admits no round). The periods each user can take part in are
    computed here, once (the PLD accountant can take seconds), and stored with the series."""
    if params.get("seed") is not None:
        raise parameter_error("params.seed", params["seed"], "left out: every period of a seeded series would draw the "
                              "same noise (and a seed gives no privacy)")
    params = roundparams.validate_params(kind, params)
    now = at or datetime.now(timezone.utc)
    if not (isinstance(period_seconds, (int, float)) and math.isfinite(period_seconds)
            and period_seconds >= MIN_PERIOD_SECONDS):
        raise parameter_error("period (--period)", period_seconds, f"at least {MIN_PERIOD_SECONDS:g} second")
    optin = period_seconds / 2.0 if optin_seconds is None else optin_seconds
    if not (isinstance(optin, (int, float)) and math.isfinite(optin) and 0 < optin < period_seconds):
        raise parameter_error("opt-in window (--optin-window)", optin, f"between 0 and the period "
                              f"({period_seconds:g} s), exclusive", "Devices report in the rest of the period.")
    _check_report_phase(float(period_seconds), float(optin), optin_seconds is None, params)
    if isinstance(periods, bool) or not isinstance(periods, int) or not 1 <= periods <= MAX_PERIODS:
        raise parameter_error("periods (--periods)", periods, f"an integer from 1 to {MAX_PERIODS}")
    first = now if start is None else start.astimezone(timezone.utc)
    if first < now - timedelta(seconds=period_seconds):
        raise parameter_error("start (--start)", first.isoformat(timespec="seconds"), "at most one period in the past",
                              "Leave it out to start now.")
    retention = max(1.0, period_seconds / 3600.0) if retention_hours is None else retention_hours
    if not (isinstance(retention, (int, float)) and math.isfinite(retention)
            and optin / 3600.0 < retention <= MAX_RETENTION_HOURS):
        raise parameter_error("retention_hours (--retention-hours)", retention,
                              f"longer than the opt-in window ({optin / 3600.0:g} h) and at most "
                              f"{MAX_RETENTION_HOURS:g}", "Raw opt-in data are purged at the deadline, and a round "
                              "still collecting them is then aborted.")
    if flagged not in ON_FLAG:
        raise parameter_error("flagged (--flagged)", flagged, " or ".join(repr(f) for f in ON_FLAG))
    carry = _check_carry(kind, params, carry)
    admitted = admitted_document(store, kind, params, periods)
    if admitted["ledger"] < 1:
        raise parameter_error("epsilon", params["epsilon"], f"within the lifetime budget (epsilon "
                              f"{store.lifetime_epsilon:g}, delta {store.lifetime_delta:g}): this budget admits no "
                              "round of the series", "Give each period a smaller epsilon (and delta).")
    return SeriesPlan(kind, name, params, first, float(period_seconds), float(optin), periods, flagged,
                      float(retention), carry, admitted)


def _span(seconds: float) -> str:
    """``1200`` → ``20m``, ``90`` → ``90s``: a duration as ``--period`` takes it (whole units only)."""
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _check_report_phase(period: float, optin: float, default_optin: bool, params: dict[str, Any]) -> None:
    """Refuse a period that leaves less than :data:`MIN_REPORT_PHASE_SECONDS` after its opt-in window: the error
    names the period, the opt-in window, the round's issuance and report windows, and the shortest period (or the
    longest opt-in window) that works."""
    left = period - optin
    if left >= MIN_REPORT_PHASE_SECONDS:
        return
    need = MIN_REPORT_PHASE_SECONDS
    shortest = 2.0 * need if default_optin else optin + need
    shortest = math.ceil(shortest / 60.0) * 60.0
    optin_fix = "" if period <= need else f", or a shorter --optin-window (at most {_span(period - need)})"
    raise parameter_error(
        "period (--period)", period,
        f"long enough to leave at least {need:g} s after the opt-in window for the head list, report tokens and "
        f"reports: a period of {period:g} s with an opt-in window (--optin-window) of {optin:g} s leaves "
        f"{left:g} s, into which the round's issuance window (params.issuance_seconds, "
        f"{params['issuance_seconds']:g} s) and report window (params.report_seconds, {params['report_seconds']:g} s) "
        "would be squeezed, and the round would close while devices still report",
        f"Use --period {_span(shortest)} or longer{' (the opt-in window is half of it)' if default_optin else ''}"
        f"{optin_fix}.")


def schedule_warnings(period: float, optin: float, params: dict[str, Any]) -> list[str]:
    """What is at risk in a series' schedule (shown with the series; nothing is refused): the round's issuance and
    report windows do not fit in the time a period leaves after its opt-in window, less the close's slack, so
    every period shrinks both in proportion (:func:`rounds.commit_keys`). Devices then have less time to get a
    token and to report, and a smaller anonymity set per report time. Empty when they fit."""
    issuance, report = float(params.get("issuance_seconds", 0.0)), float(params.get("report_seconds", 0.0))
    room = (1.0 - rounds.REPORT_SLACK) * max(0.0, period - optin)
    if issuance + report <= room:
        return []
    scale = room / (issuance + report) if issuance + report > 0 else 0.0
    return [f"the round's issuance and report windows ({issuance:g} s + {report:g} s: params.issuance_seconds and "
            f"params.report_seconds) do not fit in the {room:g} s each period leaves after its opt-in window (less a "
            f"tenth kept before the close): every period shrinks them to {issuance * scale:.0f} s + "
            f"{report * scale:.0f} s. Give shorter windows, a longer --period or a shorter --optin-window."]


def _check_carry(kind: str, params: dict[str, Any], carry: int | None) -> int:
    """The series' carry, checked: BLENDER series whose estimator releases S's counts (the carried records are the
    ones S selected, ALGORITHM.md §13.1); 0 for a mean series."""
    from hybriddp.curator.carry import DEFAULT_CARRY

    if carry is None:
        return DEFAULT_CARRY if kind == "blender" and _releases_s(params) else 0
    if isinstance(carry, bool) or not isinstance(carry, int) or not 0 <= carry <= MAX_PERIODS:
        raise parameter_error("carry (--carry)", carry, f"an integer from 0 to {MAX_PERIODS}: periods a record the "
                              "head list selected stays listed (0: each period's list is its own)")
    if carry and kind != "blender":
        raise parameter_error("carry (--carry)", carry, "0 for a mean series: it has no head list")
    if carry and not _releases_s(params):
        raise parameter_error("carry (--carry)", carry, f"0 with estimator {params.get('estimator')!r}, which releases "
                              "no S counts to tell selected records from carried ones",
                              "Use the default estimator (reuse) or consistent, or --carry 0.")
    return carry


def _releases_s(params: dict[str, Any]) -> bool:
    from hybriddp.core.estimators import Release

    return roundparams.blender_params(params).estimator_spec.release is Release.REUSE_S


def admitted_document(store: Store, kind: str, params: dict[str, Any], periods: int) -> dict[str, Any]:
    """What :func:`status` shows of the budget: periods per user by basic composition and by the ledger's rule (at
    most ``periods``), with the lifetime budget they were computed for."""
    basic, tight = admitted_periods(store, kind, params, periods)
    return {"lifetime_epsilon": store.lifetime_epsilon, "lifetime_delta": store.lifetime_delta, "basic": basic,
            "ledger": tight}


def admitted_periods(store: Store, kind: str, params: dict[str, Any], most: int) -> tuple[int, int]:
    """(by basic composition, by the ledger's rule, at most ``most`` extended): periods one opt-in user can take
    part in under the lifetime budget (:func:`hybriddp.audit.pld.admitted_rounds`, ALGORITHM.md §14)."""
    from hybriddp.audit.pld import admitted_rounds, round_mechanism

    return admitted_rounds(round_mechanism(kind, params), store.lifetime_epsilon, store.lifetime_delta, most)


def create_series(store: Store, plan: SeriesPlan, first_round: str | None = None) -> SeriesInfo:
    """Store the planned series (:func:`plan_series`); its first round opens with the next :func:`advance`."""
    if first_round is not None:
        given = store.round(first_round)
        if given.params != plan.params:
            raise ConflictError(f"round {first_round}'s parameters differ from the series'; create the series with "
                                "that round's parameters, or leave --first-round out")
    return store.create_series(plan.kind, plan.name, plan.params, start=plan.start,
                               period_seconds=plan.period_seconds, optin_seconds=plan.optin_seconds,
                               periods=plan.periods, flagged=plan.flagged, retention_hours=plan.retention_hours,
                               first_round=first_round, carry=plan.carry, admitted=plan.admitted)


def _round_name(series: SeriesInfo, k: int) -> str:
    return f"{series.name or 'series ' + series.id[:6]} · period {k + 1} of {series.periods}"


def advance(store: Store, series_id: str, *, at: datetime | None = None, step: bool = False) -> list[str]:
    """Do what is due in the series at time ``at`` (default now) and return what was done, one line each.

    Due: the round of a period whose opt-in window has passed publishes its head list (or is aborted when nobody
    uploaded: there is nothing to build from); the round of a period that has ended is closed; the period running
    now gets its round; the series ends once its last period is over. ``step``: an administrator's override that
    does the next action now whatever the clock says (close a period early, open the next one)."""
    series = store.series(series_id)
    if series.state != "active":
        return []
    t = at or datetime.now(timezone.utc)
    done: list[str] = []
    have = store.series_rounds(series)
    if step:
        return _step(store, series, have, done)
    k_now = series.period_at(t)
    for k, r in sorted(have.items()):
        starts = series.period_start(k)
        if r.state == "collecting-optin" and t >= starts + timedelta(seconds=series.optin_seconds):
            _publish(store, k, r, done)
        elif r.state in REPORT_STATES and t >= series.period_start(k + 1):
            _close(store, series, k, r, done)
    if 0 <= k_now < series.periods and k_now not in have:
        _open(store, series, k_now, done)
    if k_now >= series.periods:
        _end_if_over(store, series, done)
    return done


def _step(store: Store, series: SeriesInfo, have: dict[int, RoundInfo], done: list[str]) -> list[str]:
    if have:
        k = max(have)
        r = have[k]
        if r.state == "collecting-optin":
            _publish(store, k, r, done)
            return done
        if r.state in REPORT_STATES and _reported(r):
            _close(store, series, k, r, done)
            return done
        nxt = k + 1
    else:
        nxt = 0
    if nxt < series.periods:
        _open(store, series, nxt, done)
    else:
        _end_if_over(store, series, done)
    return done


def _open(store: Store, series: SeriesInfo, k: int, done: list[str]) -> None:
    try:
        info, made = store.open_period(series, k, _round_name(series, k))
    except ConflictError:  # cancelled meanwhile
        return
    if made:
        done.append(f"period {k + 1}: opened round {info.id} (collecting opt-in data)")


def _publish(store: Store, k: int, r: RoundInfo, done: list[str]) -> None:
    """Build and publish the period's head list; a round nobody uploaded to (or whose build the budget refuses)
    is aborted, which deletes its raw data: its period publishes nothing."""
    try:
        info = rounds.publish_headlist(store, r.id)
        done.append(f"period {k + 1}: round {r.id} built its head list ({info.state})")
    except ConflictError:  # another scheduler got there first
        return
    except HybridDPError as exc:  # no opt-in data, the budget, an empty build (DataError is one)
        if store.round(r.id).state != "collecting-optin":
            raise
        logger.warning("series period %d: round %s cannot build its head list (%s); aborted", k + 1, r.id, exc)
        store.abort(r.id)
        done.append(f"period {k + 1}: round {r.id} aborted: {str(exc).splitlines()[0][:200]}")


def _close(store: Store, series: SeriesInfo, k: int, r: RoundInfo, done: list[str]) -> None:
    """Close the period's round; one that no device reported to is left open (there is nothing to estimate from
    the clients): an administrator closes it once devices report, or deletes it."""
    if not _reported(r):
        return
    try:
        info = closing.close_round(store, r.id, series.flagged)
    except ConflictError:
        return
    done.append(f"period {k + 1}: round {r.id} closed ({info.state})")


def _reported(r: RoundInfo) -> bool:
    return (r.reports if r.kind == "blender" else r.messages) > 0


def _end_if_over(store: Store, series: SeriesInfo, done: list[str]) -> None:
    """End the series once no period's round waits for the scheduler: every round built its head list (or ended),
    and every round with reports was closed."""
    live = [r for r in store.series_rounds(series).values()
            if r.state in ("collecting-optin", "building-headlist", "closed")
            or (r.state in REPORT_STATES and _reported(r))]
    if live:
        return
    try:
        store.end_series(series.id, "ended")
    except ConflictError:
        return
    done.append(f"series {series.id} ended")


def advance_all(store: Store, *, at: datetime | None = None) -> list[str]:
    """:func:`advance` on every active series; a series whose step fails is logged and left for the next tick."""
    done: list[str] = []
    for series in store.series_list("active"):
        try:
            done += advance(store, series.id, at=at)
        except HybridDPError as exc:
            logger.error("series %s: %s", series.id, exc)
        except Exception:  # a bug in one series must not stop the others
            logger.exception("series %s: its step failed", series.id)
    return done


def status(store: Store, series_id: str, *, admin: bool = False, at: datetime | None = None) -> dict[str, Any]:
    """The series with one row per period: its times, its round (id, state, counts) or why it has none."""
    series = store.series(series_id)
    have = store.series_rounds(series)
    t = at or datetime.now(timezone.utc)
    k_now = series.period_at(t)
    rows = []
    for k in range(series.periods):
        starts = series.period_start(k)
        r = have.get(k)
        row: dict[str, Any] = {"period": k + 1, "starts": starts.isoformat(timespec="seconds"),
                               "optin_until": (starts + timedelta(seconds=series.optin_seconds))
                               .isoformat(timespec="seconds"),
                               "ends": series.period_start(k + 1).isoformat(timespec="seconds")}
        if r is not None:
            row["round"] = {"id": r.id, "state": r.state, "messages": r.messages, "reports": r.reports,
                            "optin_users": r.optin_users if admin else None}
            if r.state in REPORT_STATES and not _reported(r) and k < k_now:
                row["note"] = ("no device reports by the period's end: left open (close it once devices report, or "
                               "delete it)")
            elif r.state == "aborted":
                row["note"] = "no head list: nobody uploaded opt-in data in its window, or its build was refused"
            elif r.state == "headlist-empty":
                row["note"] = "no record passed the head list's threshold (a charged release)"
        else:
            row["round"] = None
            row["note"] = ("skipped (no round was opened during the period)" if k < k_now or series.state != "active"
                           else "opens with the scheduler's next run" if k == k_now else "not started")
        rows.append(row)
    eps, delta = float(series.params["epsilon"]), float(series.params.get("delta", 0.0))
    adm = series.admitted
    if adm is None or (adm["lifetime_epsilon"], adm["lifetime_delta"]) != (store.lifetime_epsilon,
                                                                          store.lifetime_delta):
        adm = admitted_document(store, series.kind, series.params, series.periods)  # the budget changed since
    basic, tight = int(adm["basic"]), int(adm["ledger"])
    running = series.state == "active" and 0 <= k_now < series.periods
    return {**series.to_json(admin=admin), "current_period": k_now + 1 if running else None,
            "periods_table": rows,
            "warnings": schedule_warnings(series.period_seconds, series.optin_seconds,
                                          {**roundparams.SCHEDULE_DEFAULTS, **series.params}),
            "budget": {"lifetime_epsilon": store.lifetime_epsilon, "lifetime_delta": store.lifetime_delta,
                       "round_epsilon": eps, "round_delta": delta, "periods_per_user": max(basic, tight),
                       "periods_per_user_basic": basic, "composition": "pld" if tight > basic else "basic"}}


def trend_inputs(store: Store, series_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(label, published results) of the series' periods whose results are published, in period order."""
    series = store.series(series_id)
    if series.kind != "blender":
        raise DataError(f"series {series_id} is a {series.kind} series; trends are computed over BLENDER query "
                        "estimates")
    out = []
    for k, r in sorted(store.series_rounds(series).items()):
        if r.state == "results-published":
            doc = store.documents(r.id).results
            if doc is not None:
                out.append((f"period {k + 1}", json.loads(doc)))
    return out
