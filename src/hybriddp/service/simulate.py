"""Drive a real round on a running ``hybriddp serve`` with a simulated population (``hybriddp simulate``, issue 42).

:func:`simulate` looks at the round's phase and plays the parties of that phase through the SDK, concurrently:

* **opt-in** (round ``collecting-optin``): N users of the population are enrolled in one call with the admin
  token (:meth:`AdminClient.enrol_many`) and each uploads their records with their own token
  (:class:`~hybriddp.sdk.OptinUploader`);
* **devices** (``headlist-published`` / ``collecting-reports``): M device credentials are made in one call
  (:meth:`AdminClient.create_credentials`, 10,000 a call) and each device fetches and verifies the head list,
  gets its report token, randomizes its records on the device and reports once (:class:`~hybriddp.sdk.DeviceClient`
  with ``NO_LEDGER``: a simulation charges no person's device ledger). It reports at once (``report_now``), or with
  ``spread`` at a uniformly random time in the round's report window as real devices do.

Any other state is refused with what to do (:func:`phase_of`). The work runs on ``concurrency`` threads
(:func:`drive`), paced by a token bucket (:class:`RateLimiter`) and cut at a deadline; :class:`Summary` counts what
the server acknowledged, the duplicates, refusals by HTTP status and code, errors, rate and latency per item.

The population (:class:`Population`): a synthetic preset or a given log. Users are taken from one shuffle of the
population (:func:`sample_seed`: ``seed``, else derived from the round id): opt-in users from its front, devices
from its back past the round's opt-in users, so the two phases of a round take disjoint users whenever the
population and seed are the same. The seed only picks users (and draws a synthetic population); it never reaches
a privacy mechanism: the server's curator and every device's randomizer use the OS's randomness.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from hybriddp.core.errors import HybridDPError, parameter_error
from hybriddp.core.records import RecordLog
from hybriddp.device.party import device_records
from hybriddp.sdk import (
    NO_LEDGER,
    AdminClient,
    DeviceClient,
    NotFoundError,
    OptinUploader,
    RetryPolicy,
    ServiceRequestError,
    ServiceUnavailableError,
)
from hybriddp.sdk.http import fetch_series, new_client
from hybriddp.service.demo import _records, _user_rows

OPTIN_STATES = ("collecting-optin",)
DEVICE_STATES = ("headlist-published", "collecting-reports")
CREDENTIALS_PER_CALL = 10_000
"""The server's largest credential batch (``POST /device-credentials``)."""
DEFAULT_USER_PREFIX = "sim-"
DEFAULT_OPTIN_USERS = 2000
"""Opt-in users by default: enough for a non-empty head list at `round create`'s defaults (ε 4, δ 1e-5)."""
DEFAULT_DEVICES = 500


# ----- the population ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Population:
    """Where the simulated users come from: a synthetic ``preset`` at ``scale``, or a loaded ``log``."""

    preset: str = "aol"
    scale: float = 0.02
    log: RecordLog | None = None
    source: str = ""

    def build(self, seed: int) -> RecordLog:
        """The log: the given one, or the preset drawn with ``seed``."""
        if self.log is not None:
            return self.log
        from hybriddp.datasets.synth import generate
        return generate(self.preset, seed=seed, scale=self.scale)

    def describe(self) -> str:
        return self.source or f"the {self.preset} preset at --scale {self.scale:g}"


def sample_seed(round_id: str, seed: int | None) -> int:
    """The seed of the user sample: ``seed``, else one derived from the round id (both phases of a round agree)."""
    if seed is not None:
        return int(seed)
    digest = hashlib.blake2b(round_id.encode("utf-8"), digest_size=8, person=b"hybriddp-sim").digest()
    return int.from_bytes(digest, "big") >> 1


def pick_users(n_users: int, seed: int, *, optin: int = 0, devices: int = 0, optin_taken: int = 0,
               source: str = "the population") -> tuple[np.ndarray, np.ndarray]:
    """(opt-in users, device users) as user indices: the first ``optin`` of a seeded shuffle, and ``devices`` from
    its end, never among its first ``max(optin, optin_taken)`` (the round's opt-in users). Too few users: an error
    naming the option and the fix."""
    front = max(optin, optin_taken)
    for name, want, free in (("opt-in users (--optin-users)", optin, n_users),
                             ("devices (--devices)", devices, n_users - front)):
        if want > free:
            grow = 1.1 * (want + (front if devices else 0)) / max(n_users, 1)
            raise parameter_error(name, want, f"<= {max(free, 0):,}: {source} has {n_users:,} users"
                                  + (f", {front:,} of them the round's opt-in users" if front and devices else ""),
                                  f"Ask for fewer, or use a larger population (a --scale {grow:.2g} times as large, "
                                  "or a larger --input).")
    order = np.random.default_rng(seed).permutation(n_users)
    return order[:optin], order[n_users - devices:][::-1].copy()


# ----- pacing and concurrency -------------------------------------------------------------------------
class RateLimiter:
    """A token bucket of ``rate`` tokens a second holding at most one token.

    Guarantee: the k-th successful :meth:`acquire` (k = 0, 1, ...) returns no earlier than the first one plus
    k / ``rate`` seconds, whatever the number of threads calling it: n items take at least (n − 1) / rate seconds.
    """

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
            raise parameter_error("rate (--rate)", rate, "a finite number > 0 (items a second)")
        self.interval = 1.0 / float(rate)
        self._clock, self._sleep = clock, sleep
        self._next: float | None = None
        self._lock = threading.Lock()

    def acquire(self, deadline: float | None = None) -> bool:
        """Wait for a token; False (nothing taken) when it would come after ``deadline`` (a ``clock`` time)."""
        with self._lock:
            now = self._clock()
            at = now if self._next is None else max(now, self._next)
            if deadline is not None and at > deadline:
                return False
            self._next = at + self.interval
        if at > now:
            self._sleep(at - now)
        return True


@dataclass
class Outcome:
    """One item's result: acknowledged (``duplicate``: the server had it already), or ``waiting`` to be sent later
    (counted when it is); ``latency`` overrides the measured time (seconds) when the item waited on purpose."""

    duplicate: bool = False
    records: int = 0
    latency: float | None = None
    waiting: bool = False


@dataclass
class Tally:
    """What :func:`drive` counted (thread-safe through :meth:`add`)."""

    acknowledged: int = 0
    duplicates: int = 0
    records: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    not_started: int = 0
    waiting: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def done(self) -> int:
        return self.acknowledged + sum(self.refused.values()) + sum(self.errors.values())

    def add(self, outcome: Outcome | BaseException, latency: float) -> None:
        with self.lock:
            if isinstance(outcome, Outcome) and outcome.waiting:
                self.waiting += 1
                return
            if isinstance(outcome, Outcome):
                self.acknowledged += 1
                self.duplicates += outcome.duplicate
                self.records += outcome.records
                self.latencies.append(outcome.latency if outcome.latency is not None else latency)
                return
            kind, reason = classify(outcome)
            (self.refused if kind == "refused" else self.errors)[reason] += 1
            self.examples.setdefault(reason, " ".join(str(outcome).split())[:300] or type(outcome).__name__)


def classify(exc: BaseException) -> tuple[str, str]:
    """("refused", "HTTP 409 too_few_tokens") for a server's refusal, ("error", why) for anything else."""
    if isinstance(exc, ServiceRequestError) and not isinstance(exc, ServiceUnavailableError) and exc.status:
        return "refused", f"HTTP {exc.status}" + (f" {exc.code}" if exc.code else "")
    if isinstance(exc, ServiceUnavailableError):
        return "error", "unavailable" + (f" (HTTP {exc.status})" if exc.status else "")
    return "error", type(exc).__name__


def drive(items: Sequence[Any], work: Callable[[Any], Outcome], *, concurrency: int,
          limiter: RateLimiter | None = None, deadline: float | None = None, tally: Tally | None = None,
          progress: Callable[[Tally], None] | None = None, stop: threading.Event | None = None) -> Tally:
    """Run ``work(item)`` for every item on ``concurrency`` threads, each start paced by ``limiter``; items not
    started by ``deadline`` (a :func:`time.monotonic` time) are counted in ``not_started``. An exception of ``work``
    is counted (:func:`classify`), never raised. ``progress(tally)`` is called after every item."""
    tally = tally if tally is not None else Tally()
    stop = stop or threading.Event()
    nxt = iter(range(len(items)))
    take = threading.Lock()

    def worker() -> None:
        while not stop.is_set():
            with take:
                i = next(nxt, None)
            if i is None:
                return
            if (limiter is not None and not limiter.acquire(deadline)) or (
                    deadline is not None and time.monotonic() > deadline):
                with tally.lock:
                    tally.not_started += 1
                continue
            t0 = time.perf_counter()
            try:
                result: Outcome | BaseException = work(items[i])
            except Exception as exc:  # counted and reported, never raised: one item's failure is not the run's
                result = exc
            tally.add(result, time.perf_counter() - t0)
            if progress is not None:
                progress(tally)

    threads = [threading.Thread(target=worker, name=f"hybriddp-simulate-{k}", daemon=True)
               for k in range(max(1, min(concurrency, len(items))))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # short joins: Ctrl-C reaches the main thread
    except BaseException:
        stop.set()
        raise
    return tally


# ----- the summary ------------------------------------------------------------------------------------
@dataclass
class Summary:
    """One run of :func:`simulate`: what was planned, what the server answered, how fast."""

    round: str
    phase: str  # "optin" or "devices"
    state: str  # the round's state before the run
    population: str
    users: int
    planned: int
    tally: Tally
    elapsed: float
    setup_seconds: float
    concurrency: int
    target_rate: float | None
    series: str | None = None
    counts: dict[str, Any] = field(default_factory=dict)  # the round's counts after the run
    next_step: str = ""

    @property
    def failed(self) -> int:
        return sum(self.tally.refused.values()) + sum(self.tally.errors.values())

    def latency_ms(self) -> dict[str, float | None]:
        lat = np.asarray(self.tally.latencies, dtype=float) * 1000.0
        return {f"p{q}": (round(float(np.percentile(lat, q)), 2) if lat.size else None) for q in (50, 95, 99)}

    def failure(self) -> str | None:
        """One line saying why the run failed (None when every started item was acknowledged)."""
        if not self.failed:
            return None
        what = "opt-in uploads" if self.phase == "optin" else "devices"
        reasons = (self.tally.refused + self.tally.errors).most_common()
        first = reasons[0][0]
        return (f"{self.failed:,} of {self.planned:,} {what} failed ("
                + ", ".join(f"{n:,}× {r}" for r, n in reasons) + f"); first {first}: {self.tally.examples[first]}")

    def to_json(self) -> dict[str, Any]:
        t = self.tally
        return {"round": self.round, "series": self.series, "phase": self.phase, "state": self.state,
                "population": self.population, "population_users": self.users, "planned": self.planned,
                "acknowledged": t.acknowledged, "counted": t.acknowledged - t.duplicates, "duplicates": t.duplicates,
                "records": t.records if self.phase == "optin" else None,
                "refused": dict(t.refused), "errors": dict(t.errors), "failed": self.failed,
                "not_started": t.not_started, "elapsed_seconds": round(self.elapsed, 3),
                "setup_seconds": round(self.setup_seconds, 3),
                "rate_per_second": round(t.done / self.elapsed, 2) if self.elapsed > 0 else None,
                "target_rate": self.target_rate, "concurrency": self.concurrency,
                "latency_ms": self.latency_ms(), "round_counts": self.counts, "next": self.next_step,
                "failure": self.failure()}


# ----- the round and its phase ------------------------------------------------------------------------
def find_round(admin: AdminClient, round_id: str | None, series: str | None) -> dict[str, Any]:
    """The round (admin view): ``round_id``, or the round of ``series``' current period. Unknown ids and a series
    with no round open now are errors naming the id and the fix."""
    if series is not None:
        try:
            doc = fetch_series(admin, series)
        except NotFoundError:
            raise parameter_error("series (--series)", series, f"the id of a series on {admin.base_url}",
                                  "`hybriddp series list` shows them.") from None
        period = doc.get("current_period")
        row = (doc.get("periods_table") or [])[period - 1] if isinstance(period, int) else None
        if not row or not row.get("round"):
            why = row.get("note") if row else f"the series is {doc.get('state')} with no current period"
            raise parameter_error("series (--series)", series, "a series with a round open now",
                                  f"Now: {why}. `hybriddp series status {series}` shows its periods; `hybriddp "
                                  f"series advance {series}` opens a period that is due.")
        round_id = row["round"]["id"]
    assert round_id is not None
    try:
        return admin.round(round_id)
    except NotFoundError:
        raise parameter_error("round", round_id, f"the id of a round on {admin.base_url}",
                              "`hybriddp round list` shows them.") from None


def phase_of(rnd: dict[str, Any]) -> str:
    """"optin" or "devices" from the round's state; any other state (or a mean round) is an error saying what to do."""
    rid, state = rnd["id"], rnd["state"]
    if rnd.get("kind") != "blender":
        raise parameter_error("round", rid, "a BLENDER round", f"It is a {rnd.get('kind')} round: its opt-in users "
                              "and devices send numbers, which a population of search records does not have.")
    if state in OPTIN_STATES:
        return "optin"
    if state in DEVICE_STATES:
        return "devices"
    todo = {"building-headlist": "its head list is being built: run again in a moment",
            "closed": f"it takes no more data: `hybriddp round results {rid}`",
            "results-held": f"it takes no more data; its results are held: `hybriddp round publish-results {rid}`",
            "results-published": f"it takes no more data: `hybriddp round results {rid}`",
            "headlist-empty": "it ended with an empty head list: create a new round (`hybriddp round create`)",
            "aborted": "it was aborted: create a new round (`hybriddp round create`)",
            "deleted": "it was deleted: create a new round (`hybriddp round create`)"}
    raise parameter_error("round", rid, "a round collecting opt-in data (simulate opt-in users) or device reports "
                          "(simulate devices)", f"It is {state!r}: {todo.get(state, 'see `hybriddp round status`')}.")


def next_step(phase: str, rnd: dict[str, Any]) -> str:
    """What to run after this phase."""
    rid = rnd["id"]
    series = (rnd.get("series") or {}).get("id")
    if series:
        what = "builds its head list" if phase == "optin" else "closes the round"
        return (f"the series {what} on schedule (or now: hybriddp series advance {series} --step); then "
                + ("hybriddp simulate --series " + series + " --devices M" if phase == "optin"
                   else f"hybriddp round results {rid}"))
    if phase == "optin":
        return f"hybriddp round publish {rid}, then hybriddp simulate {rid} --devices M"
    return f"hybriddp round close {rid}, then hybriddp round results {rid}"


# ----- the two phases -----------------------------------------------------------------------------------
@dataclass
class Settings:
    """How to drive: threads, pace, deadline (seconds from the start), retries, timing of device reports."""

    concurrency: int = 8
    rate: float | None = None
    duration: float | None = None
    retries: int = 5
    spread: bool = False
    user_prefix: str = DEFAULT_USER_PREFIX


def plan_count(given: int | None, rate: float | None, duration: float | None, default: int) -> int:
    """The phase's item count: ``given``; else ``rate · duration`` when both are set; else ``default``."""
    if given is not None:
        return given
    if rate is not None and duration is not None:
        return max(1, math.ceil(rate * duration))
    return default


def _pace(n: int, s: Settings) -> float | None:
    """Items a second: ``rate``; else ``n / duration`` (the work spread over the duration); else unpaced."""
    return s.rate if s.rate is not None else (n / s.duration if s.duration else None)


def _run(items: Sequence[Any], work: Callable[[Any], Outcome], s: Settings, progress: Any) -> tuple[Tally, float]:
    rate = _pace(len(items), s)
    start = time.monotonic()
    deadline = None if s.duration is None else start + s.duration
    tally = drive(items, work, concurrency=s.concurrency, limiter=None if rate is None else RateLimiter(rate),
                  deadline=deadline, progress=progress)
    return tally, time.monotonic() - start


def optin_phase(admin: AdminClient, http: httpx.Client, rid: str, log: RecordLog, users: np.ndarray, s: Settings,
                progress: Any = None) -> tuple[Tally, float, float]:
    """Enrol ``users`` in one call, then each uploads their records with their own token; (tally, elapsed, setup)."""
    t0 = time.monotonic()
    tokens = admin.enrol_many(rid, [s.user_prefix + k for k in log.user_keys(users)])
    rows, bounds = _user_rows(log, users)
    setup = time.monotonic() - t0
    retry = RetryPolicy(attempts=s.retries + 1)

    def upload(i: int) -> Outcome:
        records = _records(log, rows[bounds[i]:bounds[i + 1]])
        stored = OptinUploader(admin.base_url, rid, tokens[i], client=http, retry=retry).upload(records)
        return Outcome(duplicate=stored == 0 and len(records) > 0, records=stored)

    tally, elapsed = _run(range(len(tokens)), upload, s, progress)
    return tally, elapsed, setup


def device_phase(admin: AdminClient, http: httpx.Client, rid: str, log: RecordLog, users: np.ndarray, s: Settings,
                 progress: Any = None) -> tuple[Tally, float, float]:
    """Make one credential per device (none when the server takes reports without tokens), then each device takes
    part through :class:`DeviceClient` (no device ledger; at once, or at its time with ``spread``)."""
    t0 = time.monotonic()
    retry = RetryPolicy(attempts=s.retries + 1)
    with DeviceClient(admin.base_url, rid, NO_LEDGER, client=http) as probe:
        _, tokens_needed = probe.token_key()
    creds: list[str | None] = [None] * len(users)
    if tokens_needed:
        creds = []
        for i in range(0, len(users), CREDENTIALS_PER_CALL):
            n = min(CREDENTIALS_PER_CALL, len(users) - i)
            creds += [c["credential"] for c in admin.create_credentials(n, label=f"hybriddp simulate {rid}")]
    off = log.user_offsets
    setup = time.monotonic() - t0
    waiting: list[tuple[float, int, DeviceClient, float]] = []
    lock = threading.Lock()

    def take_part(i: int) -> Outcome:
        u = int(users[i])
        records = device_records(log, np.arange(off[u], off[u + 1]))
        dev = DeviceClient(admin.base_url, rid, NO_LEDGER, credential=creds[i], report_now=not s.spread,
                           client=http, retry=retry)
        t = time.perf_counter()
        ack = dev.participate(records, wait=False)
        if ack.pending:  # spread: token got, message kept until its time in the report window
            with lock:
                waiting.append((float(ack.send_at or 0.0), i, dev, time.perf_counter() - t))
            return Outcome(waiting=True)
        return Outcome(duplicate=ack.counted == 0)

    tally, elapsed = _run(range(len(users)), take_part, s, progress)
    if not waiting:
        return tally, elapsed, setup

    def send(item: tuple[float, int, DeviceClient, float]) -> Outcome:
        send_at, _, dev, spent = item
        while (left := send_at - time.time()) > 0:
            time.sleep(min(left, 1.0))
        t = time.perf_counter()
        ack = dev.send_due(wait=True)
        return Outcome(duplicate=ack is None or ack.counted == 0, latency=spent + time.perf_counter() - t)

    t1 = time.monotonic()  # each message at its time, earliest first
    drive(sorted(waiting, key=lambda w: w[:2]), send, concurrency=s.concurrency, tally=tally, progress=progress)
    tally.waiting = 0
    return tally, elapsed + time.monotonic() - t1, setup


# ----- one run ------------------------------------------------------------------------------------------
def simulate(base_url: str, admin_token: str, population: Population, *, round_id: str | None = None,
             series: str | None = None, optin_users: int | None = None, devices: int | None = None,
             seed: int | None = None, settings: Settings | None = None,
             on_start: Callable[[str, int, dict[str, Any]], Any] | None = None) -> Summary:
    """Drive the round ``round_id`` (or ``series``' current round) in its phase with ``population``.

    ``optin_users`` / ``devices``: how many (the phase's one is used; default :func:`plan_count` with
    :data:`DEFAULT_OPTIN_USERS` / :data:`DEFAULT_DEVICES`).
    ``on_start(phase, planned, round)`` is called once the work is known and may return ``progress(tally)``.
    Never raises for items that fail: they are counted in the summary (:meth:`Summary.failure`).
    """
    s = settings or Settings()
    if (round_id is None) == (series is None):
        raise parameter_error("round/--series", round_id or series, "exactly one of them: a round id, or "
                              "--series SERIES for the round of its current period")
    with AdminClient(base_url, admin_token, retry=RetryPolicy(attempts=s.retries + 1)) as admin, \
            new_client(httpx.Timeout(60.0, connect=10.0),
                       limits=httpx.Limits(max_connections=s.concurrency + 4)) as http:
        rnd = find_round(admin, round_id, series)
        phase = phase_of(rnd)
        rid = rnd["id"]
        n = (plan_count(optin_users, s.rate, s.duration, DEFAULT_OPTIN_USERS) if phase == "optin"
             else plan_count(devices, s.rate, s.duration, DEFAULT_DEVICES))
        sseed = sample_seed(rid, seed)
        log = population.build(sseed)
        taken = int((rnd.get("counts") or {}).get("optin_users") or 0)
        optin, devs = pick_users(log.n_users, sseed, source=population.describe(), optin_taken=taken,
                                 **({"optin": n} if phase == "optin" else {"devices": n}))
        progress = on_start(phase, n, rnd) if on_start is not None else None
        run = optin_phase if phase == "optin" else device_phase
        tally, elapsed, setup = run(admin, http, rid, log, optin if phase == "optin" else devs, s, progress)
        try:
            counts = admin.round(rid).get("counts") or {}
        except HybridDPError:
            counts = {}
    return Summary(round=rid, phase=phase, state=rnd["state"], population=population.describe(), users=log.n_users,
                   planned=n, tally=tally, elapsed=elapsed, setup_seconds=setup, concurrency=s.concurrency,
                   target_rate=_pace(n, s), series=series, counts=counts, next_step=next_step(phase, rnd))
