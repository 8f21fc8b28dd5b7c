"""Throughput, latency, crash safety and close time of the collection service, with and without report tokens.

Starts ``hybriddp serve`` itself (a temporary SQLite database by default; ``--db postgresql`` starts a
throwaway PostgreSQL 15 cluster with durable settings, see tests/pgcluster.py; or any ``--db URL``),
sets up a BLENDER round over HTTP (opt-in users enrol and upload, head list published), then drives
it from a separate process with concurrent keep-alive connections:

1. ``--single`` single-message POSTs over ``--single-connections`` connections (latency p50/p99, and
   the server's CPU time per request, ``single_server_cpu_us``, which a busy machine does not change);
2. the rest of the N reports as JSON-array batches of ``--batch-size`` messages; at half of them the
   server is SIGKILLed and restarted on the same database, and every batch whose acknowledgement was
   not received is sent again (ids make that safe); ``batch_server_cpu_us`` is the server's CPU time
   (all its processes: event loop, writer, check workers) per batched message, taken over the
   restarted server (from its start-up on, every batch it acknowledges is processed there once; it
   includes the start-up of its check workers, ~0.7 s of CPU each, which weighs in short runs);
   ``other_cpu_cores``: what other processes used of the machine meanwhile (it lowers the rates);
3. a sample of acknowledged messages sent again (they must come back as duplicates);
4. close: the server counts the stored reports and computes the estimates (``close_seconds``).

Then the database itself is read: every acknowledged message id must be stored exactly once
(``lost_after_kill9``, ``double_counted``). Prints one JSON object (``--json``) or a table.

Admission. The default run starts the server with ``--open-admission`` (reports need no token), as every
run before report tokens did, so its numbers compare with docs/RESULTS.md. ``--tokens`` then runs the same
phases a second time on a fresh database with admission on (the server's default): every message carries
a valid report token (protocol v2, docs/TOKENS.md: the 354-byte RFC 9578 ``Token`` with a nonce, the message
id derived from the nonce) and the server verifies every one (on the event loop for single POSTs, in the
check-worker processes for batches).

**Tokens ahead.** Devices get their tokens when they download the head list and spend them later, at a random
time in the report window; so does the bench: every token exists before the timed report phases start, and
the report phases measure redemption only. Message ``i``'s nonce is deterministic, SHA-256(domain || the run's
prefix || ``i``) (:func:`token_nonces`), so its id ``tokens.message_id_for(nonce_i)`` can be recomputed after the
run to check, id by id, that nothing was lost after ``kill -9``. Before the token run's timing starts, the bench

* measures issuance through the real API: a relay credential (``POST /api/v1/device-credentials``,
  tokens_per_round = ``--token-issue-sample``) gets the tokens of the first ``--token-issue-sample``
  messages in requests of ``--token-issue-chunk`` (client ``TokenRequest.make(key, nonce_i)``, i.e. blind,
  ``POST /api/v1/rounds/{id}/tokens``, client finalize): ``issue_tokens_per_s``, ``issue_server_cpu_us``
  (server CPU per token), ``issue_client_blind_us`` and ``issue_client_finalize_us``;
* mints the tokens of all other messages directly with the round's private key (read from the database with
  ``Store.round_key(..., private=True)``; RSASSA-PSS SHA-384 over ``token_input(round, key_id, nonce_i)``, spread
  over one process per CPU): ``tokens_minted_directly``, ``mint_seconds``. Only the sample went through the API;
* times one token check in this process (``verify_us_local``: parsing the Token and one RSA-2048 PSS
  verification, ``TokenVerifier.check``).

**Through the OHTTP relay** (``--relay``): a third run, on a fresh database with admission on (tokens ahead as
above, all minted), that starts ``hybriddp relay --target <server>`` as a process of its own, fetches the
gateway's key config through it (``GET /ohttp-keys``, checked against the head list's ``ohttp_key``), and sends
the single and batch phases through it: every request is a binary-HTTP ``POST .../reports`` encapsulated to the
gateway key (RFC 9458) and posted to the relay's ``/ohttp``, which forwards it to the service's ``/ohttp``;
singles are one message per encapsulated request, batches one JSON array of ``--batch-size`` messages per
encapsulated request; every answer is opened and its acknowledgement checked. A client-side encapsulation costs
~0.3 ms of CPU in Python (an ephemeral P-256 key, ECDH and the HKDF schedule), more than the server's whole
cost of a single report, so the single requests are **encapsulated before the timing starts** (as a device
does while its message waits in the outbox); a batch's encapsulation (~0.3 ms plus AES-GCM over ~6 MB, ~8 ms)
is negligible against its processing and is done in the loop. The server's decapsulation, the in-process
dispatch of the inner request and the sealing of the answer are all in the timed part. No ``kill -9`` in this
run (crash safety does not depend on the path a request came by); the database is still read id by id after
the close. Output keys ``relay_single_per_s``, ``relay_batch_per_s``, ``relay_single_server_cpu_us``,
``relay_batch_server_cpu_us`` (the service's CPU per message), ``relay_process_single_cpu_us`` and
``relay_process_batch_cpu_us`` (the relay process's CPU per message), the rest of the run's keys with the prefix
``relay_``, and with the token run ``gateway_single_server_cpu_us`` / ``gateway_batch_server_cpu_us``: the
server CPU the gateway adds per message (relay run minus token run).

With several runs the output holds the open run's keys as they always were and the token run's with the prefix
``tokens_`` (the table shows the runs side by side), and the cost of verification per report as the difference
of the server's CPU time: ``verify_single_server_cpu_us`` and ``verify_batch_server_cpu_us``. Targets
(``targets_met``; any missed are listed in ``targets_missed``): open admission single ≥ 3,000/s and
batched ≥ 100,000/s; with tokens single ≥ 3,000/s and batched ≥ 25,000/s; through the relay single ≥ 2,000/s and
batched ≥ 20,000/s; in every run close ≤ 15 s, nothing lost or double-counted (after ``kill -9`` but in the relay
run), no server errors. Minting costs ~0.3 ms of CPU a token, so ``--tokens`` and ``--relay`` default to 300,000
reports.

    python benchmarks/bench_service.py --json                      # SQLite, 5,000,000 reports, open admission
    python benchmarks/bench_service.py --json --db postgresql      # throwaway PostgreSQL cluster
    python benchmarks/bench_service.py --json --reports 300000 --single 20000 --tokens   # both, side by side
    python benchmarks/bench_service.py --json --reports 300000 --single 20000 --tokens --relay   # all three

First a calibration of the machine (benchmarks/machine.py); every time, CPU time and rate (keys ``..._seconds``,
``..._ms``, ``..._us...``, ``..._per_s``) is also given in its python units (the server, the relay and the load
generator are Python: request handling, JSON, SQL), in brackets after the figure (side by side: a row under it)
or, with ``--json``, as ``in_python_units`` next to ``machine`` (the calibration line then goes to stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import multiprocessing as mp
import os
import secrets
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hybriddp.service.process import RelayProcess, ServeProcess

TARGETS = {"single_reports_per_s": (">=", 3000.0), "batch_reports_per_s": (">=", 100_000.0),
           "close_seconds": ("<=", 15.0), "lost_after_kill9": ("==", 0), "double_counted": ("==", 0),
           "server_errors": ("==", 0)}
TOKEN_TARGETS = {"single_reports_per_s": (">=", 3000.0), "batch_reports_per_s": (">=", 25_000.0),
                 "close_seconds": ("<=", 15.0), "lost_after_kill9": ("==", 0), "double_counted": ("==", 0),
                 "server_errors": ("==", 0)}
"""The token run's targets (keys ``tokens_...`` in the output): every message's token verified."""
RELAY_TARGETS = {"single_reports_per_s": (">=", 2000.0), "batch_reports_per_s": (">=", 20_000.0),
                 "close_seconds": ("<=", 15.0), "lost_after_kill9": ("==", 0), "double_counted": ("==", 0),
                 "server_errors": ("==", 0)}
"""The relay run's targets: tokens ahead, every request OHTTP-encapsulated through ``hybriddp relay``."""
RELAY_NAMES = {"single_reports_per_s": "relay_single_per_s", "batch_reports_per_s": "relay_batch_per_s",
               "single_relay_cpu_us": "relay_process_single_cpu_us",
               "batch_relay_cpu_us": "relay_process_batch_cpu_us", "lost_after_kill9": "relay_lost"}
"""The relay run's keys in the output (any other key ``k`` is ``relay_k``)."""
API = "/api/v1"
TOKEN_BYTES = 354
"""A v2 token: the RFC 9578 §2.2 ``Token`` (token input 98 bytes, RSA-2048 authenticator 256)."""
TOKEN_CHARS = 472
"""A token in URL-safe base64 (354 bytes are a multiple of 3: no padding)."""
NONCE_DOMAIN = b"hybriddp bench nonce\x00"
"""The bench's deterministic nonces: SHA-256(this || the run's prefix || the message's counter)."""


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
        r = http.get(f"/rounds/{rid}/headlist")
        r.raise_for_status()
        doc = r.json()
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

    async def post(self, path: str, body: bytes, content_type: bytes = b"application/json") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (path.encode(), content_type, len(body), body))
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


def report_choices(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The one-report messages' possible reports: the empty report, and per head-list query each of its URLs
    and the query without a URL."""
    reports: list[dict[str, Any]] = [{"query": None, "url": None}]
    for q in doc["queries"]:
        reports += [{"query": q["query"], "url": u} for u in q["urls"]] + [{"query": q["query"], "url": None}]
    return reports


def message_ids(prefix: bytes, start: int, stop: int, ordered: bool = False) -> list[bytes]:
    """The ids of messages ``start .. stop-1``: a scrambled counter (8 bytes, big-endian), then the run's
    ``prefix``, in URL-safe base64. Ids look random (as devices' do: each lands at a random place in the
    primary key's B-tree) and map back to their counter. With ``ordered`` the counter is not scrambled:
    ids arrive in key order (a best case, for comparison). Built with NumPy (the generator shares the
    server's two cores, so its own work per message is kept small): 16 bytes padded to 18 encode to 24
    base64 characters whose first 22 are the id."""
    i = np.arange(start, stop, dtype=np.uint64)
    keys = i if ordered else scramble(i)
    raw = np.zeros((len(i), 18), dtype=np.uint8)
    raw[:, :8] = keys.astype(">u8").view(np.uint8).reshape(-1, 8)
    raw[:, 8:16] = np.frombuffer(prefix, dtype=np.uint8)
    enc = np.frombuffer(base64.urlsafe_b64encode(raw.tobytes()), dtype=np.uint8).reshape(-1, 24)
    return np.ascontiguousarray(enc[:, :22]).view("S22").ravel().tolist()


def token_nonces(prefix: bytes, start: int, stop: int) -> list[bytes]:
    """The token nonces of messages ``start .. stop-1``: SHA-256(:data:`NONCE_DOMAIN` || ``prefix`` || the counter as
    8 bytes big-endian), 32 bytes each. A device draws its nonce from the OS; the bench derives it so that the ids
    (:func:`token_ids`) can be recomputed to check the database after the run."""
    head = NONCE_DOMAIN + prefix
    return [hashlib.sha256(head + i.to_bytes(8, "big")).digest() for i in range(start, stop)]


def token_ids(prefix: bytes, start: int, stop: int) -> np.ndarray:
    """The ids (``S22``) of messages ``start .. stop-1`` with tokens: ``tokens.message_id_for`` of their nonces."""
    from hybriddp.core.tokens import message_id_for

    return np.array([message_id_for(n).encode() for n in token_nonces(prefix, start, stop)], dtype="S22")


class Load:
    """Message bodies with random-looking ids that map back to a counter (the database is checked id by id).

    Message ``i`` always has the same id and report (``picks[i]``), so a resent message is the same message;
    with ``tokens`` (``tokens[i]``: message ``i``'s report token, base64 bytes) each carries its token, and its id
    is ``ids[i]``, the one its token's nonce gives. With ``ohttp`` (the gateway's key config) every request is a
    binary-HTTP request encapsulated to it and posted to ``/ohttp`` at ``port`` (the relay); the answer is opened
    and its inner status and body are what :meth:`send` sees."""

    def __init__(self, port: int, rid: str, doc: dict[str, Any], prefix: bytes, picks: np.ndarray,
                 tokens: np.ndarray | None = None, ordered: bool = False, ids: np.ndarray | None = None,
                 ohttp: Any = None, authority: str = "") -> None:
        self.port, self.rid, self.ordered = port, rid, ordered
        self.path = f"{API}/rounds/{rid}/reports"
        self.prefix, self.picks, self.tokens, self.ids = prefix, picks, tokens, ids
        self.ohttp, self.authority = ohttp, authority
        self.reports = [json.dumps(r, separators=(",", ":")).encode() for r in report_choices(doc)]
        self.tails = [b'","headlist":"' + doc["content_hash"].encode() + b'","reports":[' + r + b"]}"
                      for r in self.reports]  # a message is '{"id":"' + its id + the tail of its report
        self.server_errors = 0
        self.retries = 0
        self.unexpected: list[str] = []

    def message_ids(self, start: int, stop: int) -> list[bytes]:
        if self.ids is not None:
            return self.ids[start:stop].tolist()
        return message_ids(self.prefix, start, stop, self.ordered)

    def seal(self, body: bytes) -> tuple[bytes, Any]:
        """``body`` as a POST of the reports path in binary HTTP, encapsulated to the gateway's key: the
        ``message/ohttp-req`` bytes and the context that opens the answer (RFC 9458 §4.3)."""
        from hybriddp.core import bhttp, ohttp

        inner = bhttp.encode_request("POST", "http", self.authority, self.path,
                                     [("content-type", "application/json")], body)
        return ohttp.encapsulate_request(self.ohttp, inner)

    async def post(self, conn: Conn, body: bytes, sealed: tuple[bytes, Any] | None) -> tuple[int, bytes]:
        """One POST of ``body``, directly or (with :attr:`ohttp`) encapsulated (``sealed`` if given) through the
        relay; the (inner) status and body."""
        if self.ohttp is None:
            return await conn.post(self.path, body)
        from hybriddp.core import bhttp

        enc, ctx = sealed or self.seal(body)
        status, out = await conn.post("/ohttp", enc, b"message/ohttp-req")
        if status != 200:  # the relay's or the gateway's own refusal, unencapsulated
            return status, out
        answer = bhttp.decode_response(ctx.open_response(out))
        return answer.status, bytes(answer.content)

    def messages(self, start: int, stop: int) -> list[bytes]:
        """The JSON messages ``start .. stop-1`` (with their tokens, if any)."""
        tails, ids, picks = self.tails, self.message_ids(start, stop), self.picks[start:stop].tolist()
        if self.tokens is None:
            return [b'{"id":"' + mid + tails[p] for mid, p in zip(ids, picks, strict=True)]
        toks = self.tokens[start:stop].tolist()
        return [b'{"id":"' + mid + b'","token":"' + tok + tails[p]
                for mid, tok, p in zip(ids, toks, picks, strict=True)]

    async def send(self, conn: Conn, body: bytes, n: int,
                   sealed: tuple[bytes, Any] | None = None) -> tuple[dict[str, int], bool]:
        """POST until acknowledged (connection errors while the server is down are retried): the acknowledgement,
        and whether this body was sent more than once. ``sealed``: ``body`` encapsulated ahead (:meth:`seal`;
        a retry sends the same encapsulated request again, which the gateway takes)."""
        delay, t0, retried = 0.02, time.perf_counter(), False
        while True:
            try:
                status, out = await self.post(conn, body, sealed)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
                conn.close()
                status, out = 0, b""
            if status == 200:
                ack = json.loads(out)
                if ack.get("acknowledged") != n:
                    self.unexpected.append(f"acknowledged {ack} for {n} messages")
                return ack, retried
            if status >= 500:
                self.server_errors += 1
            elif status:
                self.unexpected.append(f"{status}: {out[:300]!r}")
                raise RuntimeError(f"the server refused a valid request with {status}: {out[:300]!r}")
            if time.perf_counter() - t0 > 180:
                raise RuntimeError("the server did not come back within 180 s")
            self.retries += 1
            retried = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)


async def run_single(load: Load, start: int, count: int, connections: int,
                     sealed: list[tuple[bytes, Any]] | None = None) -> dict[str, Any]:
    """``count`` messages, one per POST, over ``connections`` connections; latencies in ms. ``sealed``: the
    requests encapsulated ahead (through the relay)."""
    latencies = np.zeros(count)
    bodies = load.messages(start, start + count)
    counter = iter(range(count))

    async def worker() -> None:
        conn = Conn(load.port)
        for i in counter:
            t = time.perf_counter()
            await load.send(conn, bodies[i], 1, None if sealed is None else sealed[i])
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
    the batches acknowledged at the first try (those resent around the restart are left out); ``batch_resent``:
    the messages of the batches that were sent more than once."""
    starts = iter(range(start, start + count, batch))
    counted = resent = 0
    latencies: list[float] = []

    async def worker() -> None:
        nonlocal counted, resent
        conn = Conn(load.port)
        for s in starts:
            n = min(batch, start + count - s)
            body = b"[" + b",".join(load.messages(s, s + n)) + b"]"
            t = time.perf_counter()
            ack, retried = await load.send(conn, body, n)
            if retried:
                resent += n
            else:
                latencies.append((time.perf_counter() - t) * 1000)
            counted += int(ack.get("counted", 0))
            with progress.get_lock():
                progress.value += n
        conn.close()

    t0, wall0 = time.perf_counter(), time.time()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return {"batch_seconds_total": time.perf_counter() - t0, "batch_wall": (wall0, time.time()),
            "batch_counted": counted, "batch_resent": resent,
            "batch_p50_ms": float(np.percentile(latencies, 50)) if latencies else float("nan"),
            "batch_p99_ms": float(np.percentile(latencies, 99)) if latencies else float("nan"),
            "batch_max_ms": max(latencies, default=float("nan"))}


async def run_resubmit(load: Load, total: int, sample: int) -> int:
    """Send ``sample`` acknowledged messages again; returns how many the server counted (must be 0)."""
    ids = np.random.default_rng(7).choice(total, size=min(sample, total), replace=False)
    conn = Conn(load.port)
    counted = 0
    for chunk in np.array_split(ids, max(1, len(ids) // 1000)):
        body = b"[" + b",".join(load.messages(int(i), int(i) + 1)[0] for i in chunk) + b"]"
        counted += int((await load.send(conn, body, len(chunk)))[0]["counted"])
    conn.close()
    return counted


def generator(args: dict[str, Any], doc: dict[str, Any], progress: Any, phase: Any, out: Any) -> None:
    """The load-generator process: single POSTs, batches (the server is killed meanwhile), resends. Through the
    relay (``args["ohttp"]``), the single requests are encapsulated before it says it is ready."""
    tokens = None if args["tokens_file"] is None else np.load(args["tokens_file"], mmap_mode="r")
    ids = None if args["ids_file"] is None else np.load(args["ids_file"])
    config = None
    if args["ohttp"] is not None:
        from hybriddp.core import ohttp

        config = ohttp.KeyConfig.parse(bytes.fromhex(args["ohttp"]))
    load = Load(args["port"], args["rid"], doc, bytes.fromhex(args["prefix"]), np.load(args["picks_file"]),
                tokens, args["ids"] == "ordered", ids, config, args["authority"])
    try:
        sealed = None if config is None else [load.seal(b) for b in load.messages(0, args["single"])]
    except Exception as exc:  # reported by the parent
        out.put({"error": f"{type(exc).__name__}: {exc}"})
        return
    out.put({"ready": True})

    async def main() -> dict[str, Any]:
        res = await run_single(load, 0, args["single"], args["single_connections"], sealed)
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


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) used so far by one process (the load generator); 0 once it is gone."""
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return t.user + t.system


def machine_busy_seconds() -> float:
    """CPU time the whole machine has been busy (all cores, every process; time stolen by the hypervisor
    counts as busy: it is capacity this machine did not get). Linux counts guest time in user time too."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - sum(getattr(t, f, 0.0) for f in ("iowait", "guest", "guest_nice"))


# ----- report tokens -----------------------------------------------------------------------------
def b64_rows(raw: np.ndarray) -> np.ndarray:
    """Rows of :data:`TOKEN_BYTES` bytes (whole tokens) as URL-safe base64, an ``S472`` array (354 is a multiple
    of 3, so the rows encode one after the other with no padding)."""
    enc = np.frombuffer(base64.urlsafe_b64encode(np.ascontiguousarray(raw).tobytes()), dtype=np.uint8)
    return np.ascontiguousarray(enc.reshape(-1, TOKEN_CHARS)).view(f"S{TOKEN_CHARS}").ravel()


def issue_sample(server: ServeProcess, rid: str, prefix: bytes, sample: int,
                 chunk: int) -> tuple[list[str], dict[str, Any]]:
    """The tokens of messages ``0 .. sample-1`` through the real API, fetched ahead as devices do (a relay
    credential; ``TokenRequest.make(key, nonce_i)`` blinds, the server blind-signs, the client finalizes), timed;
    then each checked in this process (``verify_us_local``)."""
    import httpx

    from hybriddp.core import tokens

    nonces = token_nonces(prefix, 0, sample)
    with httpx.Client(base_url=server.base_url + API, timeout=600.0) as http:
        r = http.post("/device-credentials", headers=server.admin,
                      json={"count": 1, "tokens_per_round": sample, "label": "bench relay"})
        r.raise_for_status()
        relay = {"Authorization": f"Bearer {r.json()['credentials'][0]['credential']}"}
        r = http.get(f"/rounds/{rid}/token-key")
        r.raise_for_status()
        if r.json().get("admission") != "tokens":
            raise RuntimeError(f"the server does not ask for tokens: {r.json().get('admission')!r}")
        key = tokens.RoundKey.from_dict(r.json(), rid)
        blind_s = post_s = finalize_s = 0.0
        out: list[str] = []
        cpu0 = server_cpu_seconds(server)
        for s in range(0, sample, chunk):
            part = range(s, min(sample, s + chunk))
            t = time.perf_counter()
            reqs = [tokens.TokenRequest.make(key, nonces[i]) for i in part]
            blind_s += time.perf_counter() - t
            t = time.perf_counter()
            r = http.post(f"/rounds/{rid}/tokens", headers=relay, json={"blinded_msgs": [q.blinded for q in reqs]})
            post_s += time.perf_counter() - t
            r.raise_for_status()
            t = time.perf_counter()
            out += [q.finalize(sig) for q, sig in zip(reqs, r.json()["blind_sigs"], strict=True)]
            finalize_s += time.perf_counter() - t
        server_cpu = server_cpu_seconds(server) - cpu0
    verifier = tokens.TokenVerifier(key)
    ids = [m.decode() for m in token_ids(prefix, 0, sample).tolist()]
    msgs = [{"id": ids[i], "token": out[i]} for i in range(sample)]
    t = time.perf_counter()
    for m in msgs:
        verifier.check(m, m["id"], "bench")
    verify_s = time.perf_counter() - t
    return out, {"issued_via_api": sample, "issue_chunk": chunk, "issue_tokens_per_s": round(sample / post_s),
                 "issue_server_cpu_us": round(server_cpu / sample * 1e6, 1),
                 "issue_client_blind_us": round(blind_s / sample * 1e6, 1),
                 "issue_client_finalize_us": round(finalize_s / sample * 1e6, 1),
                 "verify_us_local": round(verify_s / sample * 1e6, 1)}


_MINT: dict[str, Any] = {}  # in a minting process: the round's key and what the token inputs need


def _mint_init(der: bytes, rid: str, key_id: bytes, prefix: bytes) -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    from hybriddp.core import tokens

    _MINT.update(key=tokens.load_private(der), rid=rid, key_id=key_id, prefix=prefix,
                 pss=padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48),
                 sha384=hashes.SHA384(), token_input=tokens.token_input)


def _mint(start: int, stop: int) -> bytes:
    """The tokens (whole 354-byte ``Token`` structures, concatenated) of messages ``start .. stop-1``."""
    m = _MINT
    sign, pss, sha, token_input = m["key"].sign, m["pss"], m["sha384"], m["token_input"]
    out = []
    for nonce in token_nonces(m["prefix"], start, stop):
        signed = token_input(m["rid"], m["key_id"], nonce)
        out += (signed, sign(signed, pss, sha))
    return b"".join(out)


def mint_tokens(db_url: str, rid: str, prefix: bytes, start: int, stop: int) -> np.ndarray:
    """The tokens of messages ``start .. stop-1`` (base64, ``S472``), signed directly with the round's private key
    over ``token_input(round, key_id, nonce_i)``; the key is read from the database; spread over one process per
    CPU. Only for the benchmark: a real device gets its tokens blind-signed through the API, as
    :func:`issue_sample` does."""
    from hybriddp.core import tokens
    from hybriddp.service.store import open_store

    with open_store(db_url) as store:
        _, key, private = store.round_key(rid, private=True)
    assert private is not None
    n, step = stop - start, 5000
    if n <= 0:
        return np.zeros(0, dtype=f"S{TOKEN_CHARS}")
    starts = list(range(start, stop, step))
    with ProcessPoolExecutor(os.cpu_count() or 1, mp_context=mp.get_context("spawn"), initializer=_mint_init,
                             initargs=(tokens.private_der(private), rid, key.key_id, prefix)) as pool:
        raw = b"".join(pool.map(_mint, starts, [min(stop, s + step) for s in starts]))
    out = b64_rows(np.frombuffer(raw, dtype=np.uint8).reshape(n, TOKEN_BYTES))
    first = out[0].decode()  # the first token checks out: it verifies and gives the first message's id
    tokens.TokenVerifier(key).check({"token": first}, token_ids(prefix, start, start + 1)[0].decode(), "bench mint")
    return out


# ----- checking the database itself -------------------------------------------------------------
def stored_counts(db_url: str, rid: str, prefix: bytes, n: int, ordered: bool = False,
                  ids: np.ndarray | None = None) -> dict[str, int]:
    """Read the database itself: message rows of round ``rid``, distinct ids, how many of the ``n``
    benchmark ids are missing, and the per-entry counts' total. The ids are ``ids`` (with tokens: derived from
    the nonces, looked up) or else the scrambled counter + ``prefix`` (mapped back to the counter)."""
    import sqlalchemy as sa

    index = None if ids is None else {mid.decode(): i for i, mid in enumerate(ids[:n].tolist())}
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
                    rows += 1
                    if index is not None:
                        j = index.get(mid)
                        if j is None:
                            foreign += 1
                        else:
                            seen[j] = True
                        continue
                    raw = base64.urlsafe_b64decode(mid + "==")
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
COST_KEYS = ("token_source", "issued_via_api", "issue_chunk", "issue_tokens_per_s", "issue_server_cpu_us",
             "issue_client_blind_us", "issue_client_finalize_us", "verify_us_local", "tokens_minted_directly",
             "mint_seconds")
"""Keys of the token run that describe the tokens' cost rather than the run (printed without the prefix)."""


def run_mode(args: argparse.Namespace, mode: str, db_url: str, work: Path) -> dict[str, Any]:
    """One run (``mode`` "open": ``serve --open-admission``; "tokens": every message with a valid token; "relay":
    with tokens, every request through ``hybriddp relay`` as OHTTP, no kill) on its own server and database: the
    numbers of the module's docstring."""
    work.mkdir()
    admin = secrets.token_urlsafe(32)
    extra = ["--workers", str(args.workers)]
    if args.check_workers is not None:
        extra += ["--check-workers", str(args.check_workers)]
    if mode == "open":
        extra.append("--open-admission")
    server = ServeProcess(db_url, work, tuple(extra), admin_token=admin)
    res: dict[str, Any] = {}
    ordered = args.ids == "ordered"
    relay: RelayProcess | None = None
    try:
        res["start_seconds"] = round(server.start(), 2)
        rid, doc = setup_round(server.base_url, admin, args.optin_users, args.seed)
        prefix = secrets.token_bytes(8)
        picks = np.random.default_rng(args.seed).integers(0, len(report_choices(doc)), args.reports, dtype=np.int32)
        np.save(work / "picks.npy", picks)
        tokens_file = ids = None
        if mode != "open":  # every message's token, fetched ahead: before the timing starts
            ids = token_ids(prefix, 0, args.reports)
            np.save(work / "ids.npy", ids)
            sample = min(args.token_issue_sample, args.reports) if mode == "tokens" else 0
            api_tokens: list[str] = []
            if sample:
                api_tokens, cost = issue_sample(server, rid, prefix, sample, args.token_issue_chunk)
                res.update(cost)
            t0 = time.perf_counter()
            minted = mint_tokens(db_url, rid, prefix, sample, args.reports)
            res["mint_seconds"] = round(time.perf_counter() - t0, 1)
            res.update(tokens_minted_directly=len(minted), token_source=(
                (f"the tokens of messages 0..{sample - 1} were issued through the API (POST {API}/rounds/{{id}}/"
                 f"tokens, blind); the other {len(minted):,}" if sample else f"all {len(minted):,} tokens")
                + " were minted directly with the round's private key before the timing started"))
            tokens_file = work / "tokens.npy"
            np.save(tokens_file, np.concatenate([np.array([t.encode() for t in api_tokens], dtype=f"S{TOKEN_CHARS}"),
                                                 minted]))
            del minted, api_tokens
        config_hex = None
        if mode == "relay":
            from hybriddp.core import tokens as tok
            from hybriddp.sdk.relay import fetch_key_configs

            relay = RelayProcess(server.base_url, work)
            relay.start()
            config = fetch_key_configs(relay.base_url)[0]
            if doc.get("ohttp_key") is None or tok.unb64(doc["ohttp_key"], "ohttp_key") != config.to_bytes():
                raise RuntimeError("the relay's /ohttp-keys is not the head list's ohttp_key")
            config_hex = config.to_bytes().hex()
        ctx = mp.get_context("spawn")
        progress, phase, out = ctx.Value("q", 0), ctx.Value("i", 0), ctx.Queue()
        gen_args = {"port": server.port if relay is None else relay.port, "rid": rid, "prefix": prefix.hex(),
                    "reports": args.reports, "single": args.single, "single_connections": args.single_connections,
                    "batch_size": args.batch_size, "batch_connections": args.batch_connections,
                    "resubmit": args.resubmit, "ids": args.ids, "picks_file": str(work / "picks.npy"),
                    "tokens_file": None if tokens_file is None else str(tokens_file),
                    "ids_file": None if ids is None else str(work / "ids.npy"),
                    "ohttp": config_hex, "authority": f"127.0.0.1:{server.port}"}
        proc = ctx.Process(target=generator, args=(gen_args, doc, progress, phase, out), daemon=True)
        proc.start()
        ready = out.get(timeout=900)  # the generator is running (through the relay: the singles encapsulated)
        if "error" in ready:
            raise RuntimeError(f"load generator ({mode}): {ready['error']}")
        # no kill -9 through the relay: crash safety does not depend on the path a request takes
        kill_after = int(args.kill_at * (args.reports - args.single)) if relay is None else args.reports + 1
        down = (0.0, 0.0)  # when the server was killed and when it answered again (time.time())

        def relay_cpu() -> float:
            return 0.0 if relay is None or relay.proc is None else process_cpu_seconds(relay.proc.pid)

        cpu0, gen0, relay0 = server_cpu_seconds(server), process_cpu_seconds(proc.pid), relay_cpu()
        machine0 = (time.perf_counter(), machine_busy_seconds())
        snap: dict[str, float] = {}  # CPU times when the batches began

        def mark_batches() -> None:
            if "server" not in snap and phase.value >= 1:
                snap["server"], snap["gen"] = server_cpu_seconds(server), process_cpu_seconds(proc.pid)
                snap["relay"] = relay_cpu()

        while proc.is_alive() and phase.value < 2 and (phase.value < 1 or progress.value < kill_after):
            mark_batches()
            time.sleep(0.01)
        mark_batches()
        batch_msgs = args.reports - args.single
        # The server's CPU per batched message is taken where every message is processed exactly once: the whole
        # batch phase without a kill; with one, the restarted server from its start-up to the end of the batches
        # (the batches it acknowledges are those not acknowledged before the kill, resent ones included).
        cpu_from, done_before, killed_cpu, startup_cpu = snap.get("server"), 0, 0.0, 0.0
        if proc.is_alive() and phase.value == 1:
            killed_cpu = server_cpu_seconds(server) - snap["server"]  # read just before the kill
            wall0 = time.time()
            res["killed_after_acknowledged"] = args.single + progress.value
            server.kill9()
            time.sleep(0.05)  # acknowledgements already on their way reach the generator
            done_before = progress.value
            server.start()
            down = (wall0, time.time())
            cpu_from = startup_cpu = server_cpu_seconds(server)
        while proc.is_alive() and phase.value < 2:
            time.sleep(0.01)
        batch_cpu = batch_gen = other = None
        if phase.value >= 2 and cpu_from is not None:
            window_cpu = server_cpu_seconds(server) - cpu_from
            batch_cpu = window_cpu / max(1, batch_msgs - done_before)
            gen_now, relay_now = process_cpu_seconds(proc.pid), relay_cpu()
            if relay is not None:
                res["single_relay_cpu_us"] = round((snap["relay"] - relay0) / args.single * 1e6, 1)
                res["batch_relay_cpu_us"] = round((relay_now - snap["relay"]) / batch_msgs * 1e6, 2)
            if gen_now:  # what the rest of the machine used meanwhile (a busy neighbour lowers the rates)
                batch_gen = (gen_now - snap["gen"]) / batch_msgs
                wall, busy = time.perf_counter() - machine0[0], machine_busy_seconds() - machine0[1]
                own = ((snap["server"] - cpu0) + killed_cpu + startup_cpu + window_cpu + (gen_now - gen0)
                       + (relay_now - relay0))
                other = max(0.0, busy - own) / wall
        restart_seconds = down[1] - down[0]
        gen = out.get(timeout=3600)
        proc.join()
        if "error" in gen:
            raise RuntimeError(f"load generator ({mode}): {gen['error']} {gen.get('unexpected')}")
        b0, b1 = gen["batch_wall"]  # the server's downtime that fell within the batch phase (none in a short run
        downtime_in_batches = max(0.0, min(b1, down[1]) - max(b0, down[0]))  # that ended before the kill)
        single_cpu = snap["server"] - cpu0 if "server" in snap else None
        res.update({
            "single_reports_per_s": round(gen["single_reports_per_s"]),
            "batch_reports_per_s": round(batch_msgs / (gen["batch_seconds_total"] - downtime_in_batches)),
            "p50_ms": round(gen["p50_ms"], 2), "p99_ms": round(gen["p99_ms"], 2),
            "single_server_cpu_us": None if single_cpu is None else round(single_cpu / args.single * 1e6, 1),
            "single_generator_cpu_us": None if "gen" not in snap else round((snap["gen"] - gen0) / args.single * 1e6,
                                                                            1),
            "batch_server_cpu_us": None if batch_cpu is None else round(batch_cpu * 1e6, 2),
            "batch_generator_cpu_us": None if batch_gen is None else round(batch_gen * 1e6, 2),
            "batch_p50_ms": round(gen["batch_p50_ms"], 1), "batch_p99_ms": round(gen["batch_p99_ms"], 1),
            "batch_max_ms": round(gen["batch_max_ms"], 1), "batch_resent": gen["batch_resent"],
            "other_cpu_cores": None if other is None else round(other, 2),
            "restart_seconds": round(restart_seconds, 2), "retries": gen["retries"],
            "acknowledged": args.reports, "server_errors": gen["server_errors"],
            "resubmitted": gen["resubmitted"], "resubmitted_counted": gen["resubmitted_counted"],
        })
        import httpx

        t0 = time.perf_counter()
        r = httpx.post(f"{server.base_url}{API}/rounds/{rid}/close", headers={"Authorization": f"Bearer {admin}"},
                       timeout=600)
        res["close_seconds"] = round(time.perf_counter() - t0, 2)
        if r.status_code >= 500:
            res["server_errors"] += 1
        r.raise_for_status()
        counts = r.json()["counts"]
        res["stored"] = int(counts["reports"])
        server.stop()
        db = stored_counts(db_url, rid, prefix, args.reports, ordered, ids)
        res["stored_rows_in_db"] = db["rows"]
        res["lost_after_kill9"] = db["missing"]
        res["double_counted"] = (db["rows"] - db["distinct"]) + max(0, res["stored"] - args.reports) \
            + max(0, db["entry_counts_total"] - args.reports) + db["foreign"] + res["resubmitted_counted"]
    finally:
        if relay is not None:
            relay.stop()
        server.stop()
    return res


def relay_key(k: str) -> str:
    """The output key of the relay run's key ``k`` (:data:`RELAY_NAMES`, else ``relay_k``)."""
    return RELAY_NAMES.get(k, f"relay_{k}")


def check_targets(result: dict[str, Any], targets: dict[str, tuple[str, float]], prefix: str,
                  name: Any = None) -> list[str]:
    """The targets ``result`` misses (keys with ``prefix``, or as ``name(key)`` gives them)."""
    ops = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b}
    key = name or (lambda k: prefix + k)
    return [f"{key(k)} {op} {v:g} (measured {result[key(k)]})" for k, (op, v) in targets.items()
            if not ops[op](result[key(k)], v)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default=None,
                    help="database URL (default: a temporary SQLite file); 'postgresql' starts a throwaway cluster. "
                         "With --tokens each run gets its own database, except with a URL given here (both runs "
                         "use it, each its own round)")
    ap.add_argument("--reports", type=int, default=None,
                    help="reports stored before the close (default 5e6; with --tokens or --tokens-only 300000, since "
                         "each run's tokens are minted first, ~0.3 ms of CPU each)")
    ap.add_argument("--single", type=int, default=30_000, help="of which sent one per POST (default 30000)")
    ap.add_argument("--single-connections", type=int, default=64,
                    help="concurrent connections of the single POSTs (default 64: devices in flight at once; each "
                         "group commit waits for one fsync, 2-5 ms on this machine's disk, so with few connections "
                         "the rate measures the disk's fsync latency rather than the server, see docs/RESULTS.md)")
    ap.add_argument("--workers", type=int, default=1, help="server processes (hybriddp serve --workers; default 1)")
    ap.add_argument("--check-workers", type=int, default=None,
                    help="hybriddp serve --check-workers: processes that check (and verify the tokens of) large "
                         "bodies (default: the server's, one per CPU, at most 4)")
    ap.add_argument("--batch-size", type=int, default=10_000, help="messages per batched POST (default 10000)")
    ap.add_argument("--batch-connections", type=int, default=16,
                    help="concurrent batch uploaders (default 16: relays of many devices)")
    ap.add_argument("--ids", choices=["random", "ordered"], default="random",
                    help="message ids as devices make them (random, default) or in key order (a best case)")
    ap.add_argument("--resubmit", type=int, default=20_000, help="acknowledged messages sent again (default 20000)")
    ap.add_argument("--optin-users", type=int, default=1000)
    ap.add_argument("--kill-at", type=float, default=0.5,
                    help="share of the batches acknowledged when the server is SIGKILLed and restarted (default 0.5; "
                         "above 1: no kill, e.g. to see the batch rate without a cold restart in a short run)")
    ap.add_argument("--seed", type=int, default=1, help="seeds only the benchmark's own choice of reports")
    ap.add_argument("--tokens", action="store_true",
                    help="after the open-admission run, run the same phases with admission on (every message with "
                         "a report token, every token verified) and print both side by side, with the tokens' "
                         "issuance and verification cost")
    ap.add_argument("--tokens-only", action="store_true",
                    help="only the run with admission on (no open-admission run, so no verification cost by "
                         "difference)")
    ap.add_argument("--token-issue-sample", type=int, default=2000,
                    help="tokens issued through the API to time issuance (default 2000; the rest are minted directly)")
    ap.add_argument("--token-issue-chunk", type=int, default=1000,
                    help="blinded messages per issuance request (default 1000, at most 10000)")
    ap.add_argument("--relay", action="store_true",
                    help="then run the single and batch phases again with tokens ahead and every request "
                         "OHTTP-encapsulated through `hybriddp relay` (started here), without the kill")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    with_tokens = args.tokens or args.tokens_only
    if args.reports is None:
        args.reports = 300_000 if with_tokens or args.relay else 5_000_000
    if not 0 < args.single < args.reports:
        ap.error("--single must be between 1 and --reports - 1")
    if not 1 <= args.token_issue_chunk <= 10_000 or args.token_issue_sample < 1:
        ap.error("--token-issue-chunk must be in 1..10000 and --token-issue-sample at least 1")
    modes = (["open"] if not args.tokens_only else []) + (["tokens"] if with_tokens else []) + (
        ["relay"] if args.relay else [])
    if args.ids == "ordered" and len(modes) > 1:
        ap.error("--ids ordered is for open admission alone: with tokens the ids derive from the tokens' nonces")
    # a sibling module: the folder of a script run as `python benchmarks/X.py` is on sys.path
    from machine import calibrate, print_calibration, timing_figures, timing_of, unit_label

    machine = calibrate()
    print_calibration(machine, sys.stderr if args.json else None)

    work = Path(tempfile.mkdtemp(prefix="hybriddp-bench-"))
    cluster = None
    backend = "sqlite"
    if args.db in ("postgresql", "postgres"):
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from pgcluster import PgCluster

        cluster = PgCluster(durable=True).start()
        backend = "postgresql"
    elif args.db is not None and args.db.startswith("postgresql"):
        backend = "postgresql"
    result: dict[str, Any] = {"db": backend, "admission": "+".join(modes), "reports": args.reports,
                              "single": args.single, "cpus": os.cpu_count(), "ids": args.ids,
                              "workers": args.workers, "check_workers": args.check_workers,
                              "single_connections": args.single_connections,
                              "batch_connections": args.batch_connections, "batch_size": args.batch_size}
    runs: dict[str, dict[str, Any]] = {}
    try:
        for mode in modes:
            if cluster is not None:
                db_url = cluster.create_database(f"bench_{mode}")
            else:
                db_url = args.db or f"sqlite:///{work / f'bench-{mode}.db'}"
            runs[mode] = run_mode(args, mode, db_url, work / mode)
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    missed: list[str] = []
    if "open" in runs:
        result.update(runs["open"])
        missed += check_targets(result, TARGETS, "")
    if "tokens" in runs:
        tok = runs["tokens"]
        result.update({k if k in COST_KEYS else f"tokens_{k}": v for k, v in tok.items()})
        if "open" in runs:
            for k in ("single_server_cpu_us", "batch_server_cpu_us"):
                a, b = runs["open"].get(k), tok.get(k)
                result[f"verify_{k}"] = None if a is None or b is None else round(b - a, 1)
        missed += check_targets(result, TOKEN_TARGETS, "tokens_")
    if "relay" in runs:
        rel = runs["relay"]
        result.update({relay_key(k): v for k, v in rel.items()})
        if "tokens" in runs:
            for k in ("single_server_cpu_us", "batch_server_cpu_us"):
                a, b = runs["tokens"].get(k), rel.get(k)
                result[f"gateway_{k}"] = None if a is None or b is None else round(b - a, 1)
        missed += check_targets(result, RELAY_TARGETS, "relay_", relay_key)
    result["targets_met"] = not missed
    result["targets_missed"] = missed
    relative = timing_figures(result, machine, "python")

    def units(k: str) -> str:
        return f"  ({unit_label(k, relative[k], 'python')})" if k in relative else ""
    if args.json:
        print(json.dumps({**result, "machine": machine, "in_python_units": relative}))
    elif len(runs) >= 2:
        run_keys = [k for k in dict.fromkeys(k for r in runs.values() for k in r) if k not in COST_KEYS]
        derived = ("verify_", "gateway_", "targets_")
        for k, v in result.items():
            if not any(k.startswith(f"{m}_") for m in ("tokens", "relay")) and k not in run_keys \
                    and k not in COST_KEYS and not k.startswith(derived):
                print(f"{k:28s} {v}{units(k)}")
        names = {"open": "open admission", "tokens": "with tokens", "relay": "through relay"}
        print(f"{'':28s}" + "".join(f" {names[m]:>16s}" for m in runs))
        run_relative = [timing_figures(r, machine, "python") for r in runs.values()]
        for k in run_keys:
            print(f"{k:28s}" + "".join(f" {r.get(k)!s:>16s}" for r in runs.values()))
            if any(k in rel for rel in run_relative):
                label = "  per python unit" if timing_of(k) == ("rate", 1.0) else "  in python units"
                print(f"{label:28s}" + "".join(f" {rel.get(k, '')!s:>16s}" for rel in run_relative))
        if "tokens" in runs:
            print("token cost:")
            for k in COST_KEYS:
                print(f"  {k:26s} {result.get(k)}{units(k)}")
        for k, v in result.items():
            if k.startswith(("verify_", "gateway_")) and k not in COST_KEYS:
                print(f"  {k:26s} {v}{units(k)}")
        print(f"{'targets_met':28s} {result['targets_met']}")
        for m in missed:
            print(f"  missed: {m}")
    else:
        for k, v in result.items():
            print(f"{k:28s} {v}{units(k)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
