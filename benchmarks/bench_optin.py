"""Opt-in ingestion at scale (issue 39): enrolment, batched and single uploads, write-lock holds, and the head-list
build of a large round, against a real ``hybriddp serve``.

Starts ``hybriddp serve`` itself (a temporary SQLite database by default; ``--db postgresql`` starts a throwaway
PostgreSQL 15 cluster with durable settings, tests/pgcluster.py; or any ``--db URL``). Each run is a BLENDER round:

1. ``POST /api/v1/rounds/{id}/optin/enrol`` of all its users, ``--enrol-chunk`` users a request;
2. the users but ``--single`` upload as NDJSON (``application/x-ndjson``, one user a line with its token, one to
   five synthetic (query, url) records each), ``--batch-lines`` users a request over ``--batch-connections``
   connections: ``batch_users_per_s`` (and the server's CPU time per user, ``batch_server_cpu_us``);
3. ``--single`` users upload one JSON request each (token in ``Authorization``) over ``--single-connections``
   concurrent keep-alive connections: ``single_users_per_s`` (``single_server_cpu_us``);
4. ``round publish`` (``POST /api/v1/rounds/{id}/headlist``, what the CLI sends): the charge, the head-list build
   and the deletion of the raw data; ``publish_seconds`` (wall time) and ``publish_peak_rss_mb`` (the server's
   resident memory, sampled every 20 ms, peak during the request; ``rss_before_publish_mb`` for reference).

**Write-lock holds** are measured by a probe process during steps 1-3 on the lock every other writer needs: on
SQLite the database's write lock (``BEGIN IMMEDIATE; ROLLBACK``: what purges, reports and other uploads wait for),
on PostgreSQL the round's row lock (``SELECT ... FROM rounds WHERE num = ? FOR UPDATE``, taken first by every
upload and enrolment of the round). ``max_lock_hold_s``: on SQLite, tried without waiting every 5 ms, the longest
stretch in which the lock was always taken (one hold, or holds back to back less than ~5 ms apart); on PostgreSQL,
whose row-lock waiters queue in order, the longest any one of the server's transactions was open (sampled every
5 ms from ``pg_stat_activity``: no transaction holds the row lock longer), with the stretch in which the row lock
was always taken as ``max_lock_busy_s`` (transactions handing it on back to back, each waiter in its turn).
``max_lock_wait_s``: taken every 50 ms waiting as the server's own writers do (SQLite's busy timeout, PostgreSQL's
lock queue), its longest wait; on SQLite a waiting writer polls (up to 100 ms apart), so under back-to-back
transactions it can wait longer than any one hold.

After a warm-up round of 2,000 users (not reported), a smaller round (``--baseline`` users, default 10,000; a tenth
of ``--single`` upload singly) runs on the same server before the large one
(``--users``, default 100,000); ``cost_ratio`` is the batched cost per user of the large round over the small
one's (1.0: linear). Targets on SQLite (``targets_met``; any missed in ``targets_missed``): batched ≥ 10,000
users/s, single ≥ 1,500 users/s, no lock wait over 1 s, cost ratio ≤ 1.3, publish ≤ 30 s; PostgreSQL: half the
rates, the rest the same.

    python benchmarks/bench_optin.py                    # SQLite, 10,000 then 100,000 users, a table
    python benchmarks/bench_optin.py --json --db postgresql

First a calibration of the machine (benchmarks/machine.py); every time and rate (keys ``..._s``, ``..._seconds``,
``..._us...``, ``..._per_s``) is also given in its python units (the server is Python: request handling, JSON,
SQL), in brackets after the figure or, with ``--json``, as ``in_python_units`` next to ``machine`` (the
calibration line then goes to stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from hybriddp.service.process import ServeProcess

API = "/api/v1"
TARGETS = {"batch_users_per_s": (">=", 10_000.0), "single_users_per_s": (">=", 1500.0),
           "max_lock_hold_s": ("<=", 1.0), "cost_ratio": ("<=", 1.3), "publish_seconds": ("<=", 30.0),
           "server_errors": ("==", 0)}
RATE_KEYS = ("batch_users_per_s", "single_users_per_s")
"""Halved on PostgreSQL."""
PARAMS = {"epsilon": 4.0, "delta": 1e-5, "head_list_size": 100, "m_o": 1, "m_c": 1}


# ----- load --------------------------------------------------------------------------------------
class Conn:
    """One keep-alive HTTP/1.1 connection (light, so that the client does not starve the server)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.io: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: bytes, content_type: str, auth: str | None = None) -> tuple[int, bytes]:
        if self.io is None:
            self.io = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self.io
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        if auth is not None:
            head += f"Authorization: Bearer {auth}\r\n"
        writer.write(head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        resp = await reader.readuntil(b"\r\n\r\n")
        lower = resp.lower()
        i = lower.index(b"content-length:")
        out = await reader.readexactly(int(lower[i + 15:lower.index(b"\r\n", i)]))
        if b"connection: close" in lower:
            writer.close()
            self.io = None
        return int(resp[9:12]), out

    def close(self) -> None:
        if self.io is not None:
            self.io[1].close()


async def drive(port: int, jobs: list[tuple[str, bytes, str, str | None]], connections: int) -> dict[str, Any]:
    """POST every job (path, body, content type, token) over ``connections`` connections; the wall time,
    the acknowledged records and the non-200 answers."""
    queue = list(reversed(jobs))
    done = {"accepted": 0, "duplicates": 0, "errors": 0, "first_error": None}

    async def worker() -> None:
        conn = Conn(port)
        try:
            while queue:
                path, body, ctype, token = queue.pop()
                status, out = await conn.post(path, body, ctype, token)
                if status != 200:
                    done["errors"] += 1
                    done["first_error"] = done["first_error"] or f"{status} {out[:300]!r}"
                    continue
                ack = json.loads(out)
                done["accepted"] += ack["accepted"]
                done["duplicates"] += ack["duplicates"]
        finally:
            conn.close()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(connections, len(jobs)))))
    return {**done, "seconds": time.perf_counter() - t0}


def user_records(rng: np.random.Generator, n: int) -> list[list[dict[str, str]]]:
    """One to five synthetic records per user: Zipf-like queries over 2,000, a URL of three per query."""
    p = 1.0 / np.arange(1, 2001) ** 1.1
    sizes = rng.integers(1, 6, n)
    qs = rng.choice(2000, size=int(sizes.sum()), p=p / p.sum()).tolist()
    us = rng.integers(0, 3, len(qs)).tolist()
    out, k = [], 0
    for size in sizes.tolist():
        out.append([{"query": f"query {q}", "url": f"https://site{q}.example/{u}"}
                    for q, u in zip(qs[k:k + size], us[k:k + size], strict=True)])
        k += size
    return out


# ----- measurements -----------------------------------------------------------------------------
PROBE = "bench-optin-probe"
"""The probes' PostgreSQL ``application_name`` (left out of :data:`_OLDEST_TRANSACTION`)."""
_OLDEST_TRANSACTION = """SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)
FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'
AND application_name <> %(probe)s AND xact_start IS NOT NULL"""


def lock_probe(db_url: str, round_num: int, stop: Any, out: Any) -> None:
    """Two probes of the lock every other writer needs, the write lock (SQLite) or the round's row lock
    (PostgreSQL), until ``stop``: one takes it every 50 ms as the server's own writers do (waiting; its longest
    wait), one tries it without waiting every 5 ms (the longest stretch in which it was always taken: a hold, or
    holds back to back with less than ~5 ms between them). Puts both."""
    import sqlite3

    import sqlalchemy as sa

    pg = db_url.startswith("postgresql")
    found = {"max_lock_wait_s": 0.0, "max_lock_hold_s": 0.0, "lock_probes": 0}
    if pg:
        found["max_lock_busy_s"] = 0.0

    def connect(timeout: float) -> Any:
        if pg:
            engine = sa.create_engine(db_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool,
                                      connect_args={"application_name": PROBE})
            return engine.raw_connection()
        return sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=timeout, isolation_level=None)

    def take(con: Any, wait: bool) -> bool:
        try:
            cur = con.cursor()
            if pg:
                cur.execute("BEGIN")
                nowait = "" if wait else " NOWAIT"
                cur.execute(f"SELECT num FROM rounds WHERE num = {int(round_num)} FOR UPDATE{nowait}")
            else:
                cur.execute("BEGIN IMMEDIATE")
            cur.execute("ROLLBACK")
            return True
        except Exception:  # taken (SQLITE_BUSY, LockNotAvailable)
            if pg:
                cur.execute("ROLLBACK")
            return False

    def waiting() -> None:
        con = connect(60.0)
        while not stop.is_set():
            t0 = time.perf_counter()
            take(con, True)
            found["max_lock_wait_s"] = max(found["max_lock_wait_s"], time.perf_counter() - t0)
            found["lock_probes"] += 1
            stop.wait(0.05)

    def oldest() -> None:  # PostgreSQL: the age of the server's oldest open transaction, every 5 ms
        con = connect(0.0)  # held: a connection no longer referenced goes back to the (null) pool, closed
        cur = con.cursor()
        while not stop.is_set():
            cur.execute(_OLDEST_TRANSACTION, {"probe": PROBE})
            found["max_lock_hold_s"] = max(found["max_lock_hold_s"], float(cur.fetchone()[0]))
            stop.wait(0.005)

    threads = [threading.Thread(target=fn, daemon=True) for fn in ((waiting, oldest) if pg else (waiting,))]
    con = connect(0.0)
    out.put("ready")
    for thread in threads:
        thread.start()
    busy_since = None
    busy = "max_lock_busy_s" if pg else "max_lock_hold_s"
    while not stop.is_set():
        now = time.perf_counter()
        if take(con, False):
            busy_since = None
        elif busy_since is None:
            busy_since = now
        else:
            found[busy] = max(found[busy], now - busy_since)
        stop.wait(0.005)
    for thread in threads:
        thread.join(120)
    out.put({k: round(v, 3) for k, v in found.items()})


def server_cpu(server: ServeProcess) -> float:
    """CPU seconds (user + system) the server process has used so far."""
    import psutil

    assert server.proc is not None
    t = psutil.Process(server.proc.pid).cpu_times()
    return t.user + t.system


def peak_rss(pid: int, stop: threading.Event, out: list[int]) -> None:
    """The largest resident set of process ``pid`` and its children, sampled every 20 ms until ``stop``."""
    import psutil

    proc = psutil.Process(pid)
    while not stop.is_set():
        try:
            total = sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
        except psutil.NoSuchProcess:
            total = 0
        out.append(total)
        stop.wait(0.02)


def run_round(server: ServeProcess, args: argparse.Namespace, n: int, tag: str, seed: int) -> dict[str, Any]:
    """One round of ``n`` opt-in users through the phases of the module docstring; its measurements."""
    import httpx

    rng = np.random.default_rng(seed)
    res: dict[str, Any] = {"users": n}
    with httpx.Client(base_url=server.base_url + API, timeout=600.0, headers=server.admin) as http:
        r = http.post("/rounds", json={"kind": "blender", "name": f"bench-optin-{tag}", "params": PARAMS})
        r.raise_for_status()
        rid = r.json()["id"]
        num = _round_num(args.db_url, rid)
        ctx = mp.get_context("spawn")
        stop, out = ctx.Event(), ctx.Queue()
        probe = ctx.Process(target=lock_probe, args=(args.db_url, num, stop, out), daemon=True)
        probe.start()
        if out.get(timeout=120) != "ready":
            raise RuntimeError("the lock probe did not start")
        try:
            tokens: list[str] = []
            t0 = time.perf_counter()
            for i in range(0, n, args.enrol_chunk):
                r = http.post(f"/rounds/{rid}/optin/enrol",
                              json={"users": [f"{tag}-user-{j}" for j in range(i, min(n, i + args.enrol_chunk))]})
                r.raise_for_status()
                tokens += r.json()["tokens"]
            res["enrol_users_per_s"] = round(n / (time.perf_counter() - t0))
            records = user_records(rng, n)
            n_single = min(args.single, n)
            batched = n - n_single
            path = f"{API}/rounds/{rid}/optin/records"
            jobs = [(path, "".join(json.dumps({"token": tokens[j], "records": records[j]}) + "\n"
                                   for j in range(i, min(batched, i + args.batch_lines))).encode(),
                     "application/x-ndjson", None) for i in range(0, batched, args.batch_lines)]
            cpu0 = server_cpu(server)
            b = asyncio.run(drive(server.port, jobs, args.batch_connections))
            res["batch_server_cpu_us"] = round((server_cpu(server) - cpu0) / max(batched, 1) * 1e6)
            res["batch_users_per_s"] = round(batched / b["seconds"]) if batched else None
            res["batch_us_per_user"] = round(b["seconds"] / max(batched, 1) * 1e6, 1)
            singles = [(path, json.dumps({"records": records[j]}).encode(), "application/json", tokens[j])
                       for j in range(batched, n)]
            cpu0 = server_cpu(server)
            s = asyncio.run(drive(server.port, singles, args.single_connections))
            res["single_server_cpu_us"] = round((server_cpu(server) - cpu0) / max(n_single, 1) * 1e6)
            res["single_users_per_s"] = round(n_single / s["seconds"]) if n_single else None
            res["records"] = b["accepted"] + s["accepted"]
            res["records_expected"] = sum(len(x) for x in records)
            res["server_errors"] = b["errors"] + s["errors"]
            res["first_error"] = b["first_error"] or s["first_error"]
        finally:
            stop.set()
            res.update(out.get(timeout=60))
            probe.join(10)
        rss: list[int] = []
        stop_rss = threading.Event()
        assert server.proc is not None
        sampler = threading.Thread(target=peak_rss, args=(server.proc.pid, stop_rss, rss), daemon=True)
        sampler.start()
        time.sleep(0.1)
        res["rss_before_publish_mb"] = round(rss[0] / 2**20) if rss else None
        t0 = time.perf_counter()
        r = http.post(f"/rounds/{rid}/headlist")
        res["publish_seconds"] = round(time.perf_counter() - t0, 2)
        stop_rss.set()
        sampler.join()
        r.raise_for_status()
        res["publish_state"] = r.json()["state"]
        res["publish_peak_rss_mb"] = round(max(rss) / 2**20)
    return res


def _round_num(db_url: str, rid: str) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT num FROM rounds WHERE id = :i"), {"i": rid}).scalar_one())
    finally:
        engine.dispose()


def check_targets(result: dict[str, Any], backend: str) -> list[str]:
    """The targets ``result`` misses (rates halved on PostgreSQL)."""
    ops = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b}
    missed = []
    for k, (op, v) in TARGETS.items():
        want = v / 2 if backend == "postgresql" and k in RATE_KEYS else v
        got = result.get(k)
        if got is None or not ops[op](got, want):
            missed.append(f"{k} {op} {want:g} (measured {got})")
    return missed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default=None, help="database URL (default: a temporary SQLite file); 'postgresql' "
                                               "starts a throwaway cluster")
    ap.add_argument("--users", type=int, default=100_000, help="opt-in users of the large round (default 100000)")
    ap.add_argument("--baseline", type=int, default=10_000, help="users of the first, small round (default 10000)")
    ap.add_argument("--single", type=int, default=10_000, help="users of the large round uploading one request each "
                                                             "(default 10000; the small round: a tenth)")
    ap.add_argument("--single-connections", type=int, default=64, help="concurrent single uploads (default 64)")
    ap.add_argument("--batch-lines", type=int, default=2000, help="users per NDJSON request (default 2000)")
    ap.add_argument("--batch-connections", type=int, default=2, help="concurrent NDJSON uploaders (default 2)")
    ap.add_argument("--enrol-chunk", type=int, default=10_000, help="users per enrolment request (default 10000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    if min(args.users, args.baseline, args.batch_lines, args.enrol_chunk) < 1 or args.single < 0:
        ap.error("--users, --baseline, --batch-lines and --enrol-chunk must be at least 1, --single at least 0")
    # a sibling module: the folder of a script run as `python benchmarks/X.py` is on sys.path
    from machine import calibrate, print_calibration, timing_figures, unit_label

    machine = calibrate()
    print_calibration(machine, sys.stderr if args.json else None)

    work = Path(tempfile.mkdtemp(prefix="hybriddp-bench-optin-"))
    cluster = None
    backend = "postgresql" if (args.db or "").startswith("postgres") else "sqlite"
    result: dict[str, Any] = {"db": backend}
    try:
        if args.db in ("postgresql", "postgres"):
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from pgcluster import PgCluster

            cluster = PgCluster(durable=True).start()
            args.db_url = cluster.create_database("bench_optin")
        else:
            args.db_url = args.db or f"sqlite:///{work / 'bench-optin.db'}"
        server = ServeProcess(args.db_url, work, ("--max-body-bytes", str(64 << 20)))
        server.start()
        try:
            single = args.single
            args.single = 0
            run_round(server, args, 2000, "warm", args.seed + 2)  # first requests of a fresh server: not measured
            args.single = single // 10
            small = run_round(server, args, args.baseline, "small", args.seed)
            args.single = single
            large = run_round(server, args, args.users, "large", args.seed + 1)
        finally:
            server.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    result.update({f"small_{k}": v for k, v in small.items()})
    result.update(large)
    result["cost_ratio"] = round(large["batch_us_per_user"] / small["batch_us_per_user"], 2)
    for k in ("max_lock_hold_s", "max_lock_wait_s", "max_lock_busy_s"):
        if k in large:
            result[k] = max(small[k], large[k])
    result["server_errors"] = small["server_errors"] + large["server_errors"]
    missed = check_targets(result, backend)
    result["targets_met"] = not missed
    result["targets_missed"] = missed
    relative = timing_figures(result, machine, "python")
    if args.json:
        print(json.dumps({**result, "machine": machine, "in_python_units": relative}))
    else:
        for k, v in result.items():
            print(f"{k:28s} {v}" + (f"  ({unit_label(k, relative[k], 'python')})" if k in relative else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
