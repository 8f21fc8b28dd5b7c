"""Throughput, latency, crash safety and close time of the collection service.

Starts ``hybriddp serve`` itself (a temporary SQLite database by default; ``--db postgresql`` starts a
throwaway PostgreSQL 15 cluster with durable settings, see tests/pgcluster.py; or any ``--db URL``),
sets up a BLENDER round over HTTP (opt-in users enrol and upload, head list published), then drives
it from a separate process with concurrent keep-alive connections:

1. ``--single`` single-message POSTs over ``--single-connections`` connections (latency p50/p99, and
   the server's CPU time per request, ``single_server_cpu_us``, which a busy machine does not change);
2. the rest of the N reports as JSON-array batches of ``--batch-size`` messages; at half of them the
   server is SIGKILLed and restarted on the same database, and every batch whose acknowledgement was
   not received is sent again (ids make that safe);
3. a sample of acknowledged messages sent again (they must come back as duplicates);
4. close: the server counts the stored reports and computes the estimates (``close_seconds``).

Then the database itself is read: every acknowledged message id must be stored exactly once
(``lost_after_kill9``, ``double_counted``). Prints one JSON object (``--json``) or a table.

    python benchmarks/bench_service.py --json                      # SQLite, 5,000,000 reports
    python benchmarks/bench_service.py --json --db postgresql      # throwaway PostgreSQL cluster
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hybriddp.service.process import ServeProcess

TARGETS = {"single_reports_per_s": (">=", 3000.0), "batch_reports_per_s": (">=", 100_000.0),
           "close_seconds": ("<=", 15.0), "lost_after_kill9": ("==", 0), "double_counted": ("==", 0),
           "server_errors": ("==", 0)}
API = "/api/v1"


def setup_round(base_url: str, token: str, n_optin: int, seed: int) -> tuple[str, dict[str, Any]]:
    """Create a BLENDER round, enrol ``n_optin`` users with Zipf records, publish the head list."""
    import httpx

    rng = np.random.default_rng(seed)
    admin = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base_url + API, timeout=120.0) as http:
        r = http.post("/rounds", headers=admin, json={"kind": "blender", "name": "bench", "params": {
            "epsilon": 4.0, "delta": 1e-5, "head_list_size": 50, "m_o": 1, "m_c": 1}})
        r.raise_for_status()
        rid = r.json()["id"]
        pq = 1.0 / np.arange(1, 301) ** 1.1
        r = http.post(f"/rounds/{rid}/optin/enrol", headers=admin, json={"users": [f"u{i}" for i in range(n_optin)]})
        r.raise_for_status()
        for token in r.json()["tokens"]:
            qs = rng.choice(300, size=int(rng.integers(1, 4)), p=pq / pq.sum())
            records = [{"query": f"query {q}", "url": f"https://site{q}.example/{int(rng.integers(0, 3))}"}
                       for q in qs]
            http.post(f"/rounds/{rid}/optin/records", json={"records": records},
                      headers={"Authorization": f"Bearer {token}"}).raise_for_status()
        http.post(f"/rounds/{rid}/headlist", headers=admin).raise_for_status()
        doc = http.get(f"/rounds/{rid}/headlist").json()
    return rid, doc


# ----- the load generator (a separate process) ------------------------------------------------
_MIX = 0xBF58476D1CE4E5B9  # odd: invertible modulo 2^64
_MIX_INV = pow(_MIX, -1, 2**64)
_MASK = 2**64 - 1


def scramble(i: np.ndarray) -> np.ndarray:
    """A bijection of 64-bit integers that spreads consecutive counters over the whole range, applied to
    every element of a uint64 array (NumPy's uint64 arithmetic wraps modulo 2^64)."""
    x = i ^ (i >> np.uint64(33))
    x = x * np.uint64(_MIX)
    return x ^ (x >> np.uint64(33))


def unscramble(x: int) -> int:
    """The inverse of :func:`scramble` (``x ^ (x >> 33)`` undoes itself for 64-bit ``x``)."""
    x ^= x >> 33
    x = (x * _MIX_INV) & _MASK
    return x ^ (x >> 33)


class Conn:
    """One keep-alive HTTP/1.1 connection; light enough that the generator does not starve the server."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        i = lower.find(b"content-length:")
        if i < 0:
            raise ConnectionError("response without Content-Length")
        length = int(lower[i + 15:lower.index(b"\r\n", i)])
        body_out = await self.reader.readexactly(length)
        if b"connection: close" in lower:
            self.close()
        return status, body_out

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Load:
    """Message bodies with random-looking ids that map back to a counter (the database is checked id by id)."""

    def __init__(self, port: int, rid: str, doc: dict[str, Any], seed: int, ordered: bool = False) -> None:
        self.port, self.rid, self.ordered = port, rid, ordered
        self.path = f"{API}/rounds/{rid}/reports"
        self.prefix = secrets.token_bytes(8)
        reports = [{"query": None, "url": None}]
        for q in doc["queries"]:
            reports += [{"query": q["query"], "url": u} for u in q["urls"]] + [{"query": q["query"], "url": None}]
        self.reports = [json.dumps(r, separators=(",", ":")).encode() for r in reports]
        self.tails = [b'","headlist":"' + doc["content_hash"].encode() + b'","reports":[' + r + b"]}"
                      for r in self.reports]  # a message is '{"id":"' + its id + the tail of its report
        self.rng = np.random.default_rng(seed)
        self.server_errors = 0
        self.retries = 0
        self.unexpected: list[str] = []

    def message_ids(self, start: int, stop: int) -> list[bytes]:
        """The ids of messages ``start .. stop-1``: a scrambled counter (8 bytes, big-endian), then the run's
        prefix, in URL-safe base64. Ids look random (as devices' do: each lands at a random place in the
        primary key's B-tree) and map back to their counter. With ``ordered`` the counter is not scrambled:
        ids arrive in key order (a best case, for comparison). Built with NumPy (the generator shares the
        server's two cores, so its own work per message is kept small): 16 bytes padded to 18 encode to 24
        base64 characters whose first 22 are the id."""
        i = np.arange(start, stop, dtype=np.uint64)
        keys = i if self.ordered else scramble(i)
        raw = np.zeros((len(i), 18), dtype=np.uint8)
        raw[:, :8] = keys.astype(">u8").view(np.uint8).reshape(-1, 8)
        raw[:, 8:16] = np.frombuffer(self.prefix, dtype=np.uint8)
        enc = np.frombuffer(base64.urlsafe_b64encode(raw.tobytes()), dtype=np.uint8).reshape(-1, 24)
        return np.ascontiguousarray(enc[:, :22]).view("S22").ravel().tolist()

    def messages(self, start: int, stop: int) -> list[bytes]:
        """The JSON messages ``start .. stop-1``, each with one report drawn at random."""
        picks = self.rng.integers(0, len(self.reports), stop - start)
        tails = self.tails
        return [b'{"id":"' + mid + tails[p] for mid, p in zip(self.message_ids(start, stop), picks.tolist(),
                                                              strict=True)]

    async def send(self, conn: Conn, body: bytes, n: int) -> dict[str, int]:
        """POST until acknowledged (connection errors while the server is down are retried)."""
        delay, t0 = 0.02, time.perf_counter()
        while True:
            try:
                status, out = await conn.post(self.path, body)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
                conn.close()
                status, out = 0, b""
            if status == 200:
                ack = json.loads(out)
                if ack.get("acknowledged") != n:
                    self.unexpected.append(f"acknowledged {ack} for {n} messages")
                return ack
            if status >= 500:
                self.server_errors += 1
            elif status:
                self.unexpected.append(f"{status}: {out[:300]!r}")
                raise RuntimeError(f"the server refused a valid request with {status}: {out[:300]!r}")
            if time.perf_counter() - t0 > 180:
                raise RuntimeError("the server did not come back within 180 s")
            self.retries += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)


async def run_single(load: Load, start: int, count: int, connections: int) -> dict[str, Any]:
    """``count`` messages, one per POST, over ``connections`` connections; latencies in ms."""
    latencies = np.zeros(count)
    bodies = load.messages(start, start + count)
    counter = iter(range(count))

    async def worker() -> None:
        conn = Conn(load.port)
        for i in counter:
            t = time.perf_counter()
            await load.send(conn, bodies[i], 1)
            latencies[i] = (time.perf_counter() - t) * 1000
        conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    seconds = time.perf_counter() - t0
    return {"single_reports_per_s": count / seconds, "p50_ms": float(np.percentile(latencies, 50)),
            "p99_ms": float(np.percentile(latencies, 99)), "single_seconds": seconds}


async def run_batches(load: Load, start: int, count: int, batch: int, connections: int,
                      progress: Any) -> dict[str, Any]:
    """``count`` messages in batches; ``progress`` (shared) counts acknowledged messages. Latencies (ms) of
    the batches acknowledged at the first try (those resent around the restart are left out)."""
    starts = iter(range(start, start + count, batch))
    counted = 0
    latencies: list[float] = []

    async def worker() -> None:
        nonlocal counted
        conn = Conn(load.port)
        for s in starts:
            n = min(batch, start + count - s)
            body = b"[" + b",".join(load.messages(s, s + n)) + b"]"
            t, retries = time.perf_counter(), load.retries
            ack = await load.send(conn, body, n)
            if load.retries == retries:
                latencies.append((time.perf_counter() - t) * 1000)
            counted += int(ack.get("counted", 0))
            with progress.get_lock():
                progress.value += n
        conn.close()

    t0, wall0 = time.perf_counter(), time.time()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return {"batch_seconds_total": time.perf_counter() - t0, "batch_wall": (wall0, time.time()),
            "batch_counted": counted,
            "batch_p50_ms": float(np.percentile(latencies, 50)), "batch_p99_ms": float(np.percentile(latencies, 99)),
            "batch_max_ms": float(max(latencies))}


async def run_resubmit(load: Load, total: int, sample: int) -> int:
    """Send ``sample`` acknowledged messages again; returns how many the server counted (must be 0)."""
    ids = np.random.default_rng(7).choice(total, size=min(sample, total), replace=False)
    conn = Conn(load.port)
    counted = 0
    for chunk in np.array_split(ids, max(1, len(ids) // 1000)):
        body = b"[" + b",".join(load.messages(int(i), int(i) + 1)[0] for i in chunk) + b"]"
        counted += int((await load.send(conn, body, len(chunk)))["counted"])
    conn.close()
    return counted


def generator(args: dict[str, Any], doc: dict[str, Any], progress: Any, phase: Any, out: Any) -> None:
    """The load-generator process: single POSTs, batches (the server is killed meanwhile), resends."""
    load = Load(args["port"], args["rid"], doc, args["seed"], args["ids"] == "ordered")
    out.put({"prefix": load.prefix.hex()})

    async def main() -> dict[str, Any]:
        res = await run_single(load, 0, args["single"], args["single_connections"])
        phase.value = 1
        res.update(await run_batches(load, args["single"], args["reports"] - args["single"], args["batch_size"],
                                     args["batch_connections"], progress))
        phase.value = 2
        res["resubmitted"] = min(args["resubmit"], args["reports"])
        res["resubmitted_counted"] = await run_resubmit(load, args["reports"], args["resubmit"])
        return res

    try:
        import uvloop  # the generator's own event loop costs less CPU, leaving more of the machine to the server
        res = uvloop.run(main())
        res.update(server_errors=load.server_errors, retries=load.retries, unexpected=load.unexpected[:5])
        out.put(res)
    except Exception as exc:  # reported by the parent, which stops the server
        out.put({"error": f"{type(exc).__name__}: {exc}", "unexpected": load.unexpected[:5]})


def server_cpu_seconds(server: ServeProcess) -> float:
    """CPU time (user + system) used so far by the server process and its children (workers, check pool).

    Per single POST it is the server's cost of a request whatever else the machine runs, unlike the
    rate, which a busy neighbour on these 2 shared cores lowers."""
    import psutil

    if server.proc is None:
        return 0.0
    try:
        procs = [psutil.Process(server.proc.pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


# ----- checking the database itself -------------------------------------------------------------
def stored_counts(db_url: str, rid: str, prefix: bytes, n: int, ordered: bool = False) -> dict[str, int]:
    """Read the database itself: message rows of round ``rid``, distinct ids, how many of the ``n``
    benchmark ids (scrambled counter + ``prefix``) are missing, and the per-entry counts' total."""
    import sqlalchemy as sa

    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            num = conn.execute(sa.text("SELECT num FROM rounds WHERE id = :r"), {"r": rid}).scalar_one()
            seen = np.zeros(n, dtype=bool)
            rows = foreign = 0
            result = conn.execution_options(stream_results=True, yield_per=100_000).execute(
                sa.text("SELECT message_id FROM messages WHERE round_num = :n"), {"n": num})
            for part in result.partitions():
                for (mid,) in part:
                    raw = base64.urlsafe_b64decode(mid + "==")
                    rows += 1
                    key = int.from_bytes(raw[:8], "big")
                    i = key if ordered else unscramble(key)
                    if raw[8:] == prefix and i < n:
                        seen[i] = True
                    else:
                        foreign += 1
            counted = conn.execute(sa.text("SELECT coalesce(sum(n), 0) FROM entry_counts WHERE round_num = :n"),
                                   {"n": num}).scalar_one()
        return {"rows": rows, "distinct": int(seen.sum()) + foreign, "missing": int(n - seen.sum()),
                "foreign": foreign, "entry_counts_total": int(counted)}
    finally:
        engine.dispose()


# ----- main -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default=None,
                    help="database URL (default: a temporary SQLite file); 'postgresql' starts a throwaway cluster")
    ap.add_argument("--reports", type=int, default=5_000_000, help="reports stored before the close (default 5e6)")
    ap.add_argument("--single", type=int, default=30_000, help="of which sent one per POST (default 30000)")
    ap.add_argument("--single-connections", type=int, default=64,
                    help="concurrent connections of the single POSTs (default 64: devices in flight at once; each "
                         "group commit waits for one fsync, 2-5 ms on this machine's disk, so with few connections "
                         "the rate measures the disk's fsync latency rather than the server, see docs/RESULTS.md)")
    ap.add_argument("--workers", type=int, default=1, help="server processes (hybriddp serve --workers; default 1)")
    ap.add_argument("--batch-size", type=int, default=10_000, help="messages per batched POST (default 10000)")
    ap.add_argument("--batch-connections", type=int, default=16,
                    help="concurrent batch uploaders (default 16: relays of many devices)")
    ap.add_argument("--ids", choices=["random", "ordered"], default="random",
                    help="message ids as devices make them (random, default) or in key order (a best case)")
    ap.add_argument("--resubmit", type=int, default=20_000, help="acknowledged messages sent again (default 20000)")
    ap.add_argument("--optin-users", type=int, default=1000)
    ap.add_argument("--kill-at", type=float, default=0.5, help="share of the batches sent when the server is killed")
    ap.add_argument("--seed", type=int, default=1, help="seeds only the benchmark's own choice of reports")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    if not 0 < args.single < args.reports:
        ap.error("--single must be between 1 and --reports - 1")

    work = Path(tempfile.mkdtemp(prefix="hybriddp-bench-"))
    cluster = None
    db_url, backend = args.db, "sqlite"
    if db_url is None:
        db_url = f"sqlite:///{work / 'bench.db'}"
    elif db_url in ("postgresql", "postgres"):
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from pgcluster import PgCluster

        cluster = PgCluster(durable=True).start()
        db_url, backend = cluster.create_database("bench"), "postgresql"
    elif db_url.startswith("postgresql"):
        backend = "postgresql"
    token = secrets.token_urlsafe(32)
    server = ServeProcess(db_url, work, ("--workers", str(args.workers)), admin_token=token)
    result: dict[str, Any] = {"db": backend, "reports": args.reports, "cpus": os.cpu_count(), "ids": args.ids,
                              "workers": args.workers, "single_connections": args.single_connections,
                              "batch_connections": args.batch_connections, "batch_size": args.batch_size}
    try:
        result["start_seconds"] = server.start()
        rid, doc = setup_round(server.base_url, token, args.optin_users, args.seed)
        ctx = mp.get_context("spawn")
        progress, phase, out = ctx.Value("q", 0), ctx.Value("i", 0), ctx.Queue()
        gen_args = {"port": server.port, "rid": rid, "seed": args.seed, "reports": args.reports,
                    "single": args.single, "single_connections": args.single_connections,
                    "batch_size": args.batch_size, "batch_connections": args.batch_connections,
                    "resubmit": args.resubmit, "ids": args.ids}
        proc = ctx.Process(target=generator, args=(gen_args, doc, progress, phase, out), daemon=True)
        proc.start()
        prefix = bytes.fromhex(out.get(timeout=120)["prefix"])  # the generator is running
        kill_after = int(args.kill_at * (args.reports - args.single))
        down = (0.0, 0.0)  # when the server was killed and when it answered again (time.time())
        cpu0, single_cpu = server_cpu_seconds(server), None
        while proc.is_alive() and (phase.value < 1 or progress.value < kill_after):
            if single_cpu is None and phase.value >= 1:
                single_cpu = server_cpu_seconds(server) - cpu0
            time.sleep(0.01)
        if proc.is_alive() and phase.value == 1:
            wall0 = time.time()
            server.kill9()
            result["killed_after_acknowledged"] = args.single + progress.value
            server.start()
            down = (wall0, time.time())
        restart_seconds = down[1] - down[0]
        gen = out.get(timeout=3600)
        proc.join()
        if "error" in gen:
            raise RuntimeError(f"load generator: {gen['error']} {gen.get('unexpected')}")
        batch_msgs = args.reports - args.single
        b0, b1 = gen["batch_wall"]  # the server's downtime that fell within the batch phase (none in a short run
        downtime_in_batches = max(0.0, min(b1, down[1]) - max(b0, down[0]))  # that ended before the kill)
        result.update({
            "single_reports_per_s": round(gen["single_reports_per_s"]),
            "batch_reports_per_s": round(batch_msgs / (gen["batch_seconds_total"] - downtime_in_batches)),
            "p50_ms": round(gen["p50_ms"], 2), "p99_ms": round(gen["p99_ms"], 2),
            "single_server_cpu_us": None if single_cpu is None else round(single_cpu / args.single * 1e6, 1),
            "batch_p50_ms": round(gen["batch_p50_ms"], 1), "batch_p99_ms": round(gen["batch_p99_ms"], 1),
            "batch_max_ms": round(gen["batch_max_ms"], 1),
            "restart_seconds": round(restart_seconds, 2), "retries": gen["retries"],
            "acknowledged": args.reports, "server_errors": gen["server_errors"],
            "resubmitted": gen["resubmitted"], "resubmitted_counted": gen["resubmitted_counted"],
        })
        import httpx

        t0 = time.perf_counter()
        r = httpx.post(f"{server.base_url}{API}/rounds/{rid}/close", headers={"Authorization": f"Bearer {token}"},
                       timeout=600)
        result["close_seconds"] = round(time.perf_counter() - t0, 2)
        if r.status_code >= 500:
            result["server_errors"] += 1
        r.raise_for_status()
        counts = r.json()["counts"]
        result["stored"] = int(counts["reports"])
        server.stop()
        db = stored_counts(db_url, rid, prefix, args.reports, args.ids == "ordered")
        result["stored_rows_in_db"] = db["rows"]
        result["lost_after_kill9"] = db["missing"]
        result["double_counted"] = (db["rows"] - db["distinct"]) + max(0, result["stored"] - args.reports) \
            + max(0, db["entry_counts_total"] - args.reports) + db["foreign"] + result["resubmitted_counted"]
        result["targets_met"] = all(
            {">=": result[k] >= v, "<=": result[k] <= v, "==": result[k] == v}[op] for k, (op, v) in TARGETS.items())
    finally:
        server.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:28s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
