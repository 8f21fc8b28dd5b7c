"""A curious operator tries to link device reports to the credentials that got their tokens (issue 38).

The operator runs the real service and keeps what operators keep: an access log (time, client address and port,
path, a hash of the Authorization header) and copies of its whole database, one taken in the middle of the report
window and one after the round's close. Many devices take part concurrently through the shipped SDK with its
defaults (token on head-list download on a connection of its own, report at a uniformly random time in the
round's report window), directly and through an Oblivious HTTP relay. The operator then tries every pairing the
brief names:

* **connection**: a report request on the same client address and port as a credential's token request;
* **timing**: the k-th token request (in time) with the k-th report request (in time);
* **database order**: the k-th row of ``token_issuance`` in storage order (SQLite: key order, PostgreSQL ctid) with
  the k-th stored message in storage order (``messages_recent`` by seq, then ``messages``; ``messages`` by ctid).

Under the promise (docs/TOKENS.md "What the operator can link") report order is a uniformly random permutation of
token order, so each pairing is right for about one device (a uniform random permutation has Poisson(1) fixed
points) and the Spearman rank correlation ρ of the two orders has mean 0 and standard deviation 1/√(N−1). The
test fails when an attack does better than chance at a false-alarm probability below 1e-6: more than
:data:`MAX_PAIRS` right pairings (P[Poisson(1) > 10] ≈ 1.0e-8) or |ρ| above :data:`Z_RHO`/√(N−1) (5.3 standard
deviations; two-sided P ≈ 1.2e-7). Before report protocol v2 every attack linked every device (ρ = 1).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from hybriddp.sdk.client import AdminClient, DeviceClient, OptinRelay
from hybriddp.service import create_app
from hybriddp.service.demo import local_server
from loadfactor import slowdown

ADMIN = "admin-token-for-linking-tests"
N_DEVICES = 200
ISSUANCE_S = 25.0  # × the machine's slowdown at the start (tests/loadfactor.py): every device must have its token
# before the report window opens, or it reports at a random time in what is left of the window, which tells the
# operator something (docs/TOKENS.md "When a device reports"); 200 devices need ~10 s idle, ~35 s beside two CPU hogs
REPORT_S = 15.0
STAGGER_S = 0.02  # device i starts at i * STAGGER_S: the operator knows the issuance order exactly
MAX_PAIRS = 10
Z_RHO = 5.3
OPTIN = [("weather", "https://w.example/"), ("news", "https://n.example/"), ("maps", "https://m.example/"),
         ("mail", "https://e.example/")]


@dataclass
class AccessLog:
    """The operator's access log, as a reverse proxy or the server itself would write it (ASGI middleware).

    Each row: (monotonic time, client (address, port), method, path, SHA-256 of the Authorization header or None).
    For scoring only (the attacker does not use it), the message ids of each reports body are kept too."""

    app: Any
    rows: list[tuple[float, Any, str, str, str | None]] = field(default_factory=list)
    report_ids: dict[int, list[str]] = field(default_factory=dict)  # row index → message ids in its body

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        auth = dict(scope["headers"]).get(b"authorization")
        row = len(self.rows)
        self.rows.append((time.monotonic(), scope.get("client"), scope["method"], scope["path"],
                          None if auth is None else hashlib.sha256(auth).hexdigest()))
        if not scope["path"].endswith("/reports"):
            return await self.app(scope, receive, send)
        body = bytearray()

        async def tap() -> Any:
            msg = await receive()
            body.extend(msg.get("body", b""))
            if not msg.get("more_body"):
                with contextlib.suppress(ValueError):
                    doc = json.loads(bytes(body))
                    self.report_ids[row] = [m["id"] for m in (doc if isinstance(doc, list) else [doc])]
            return msg
        await self.app(scope, tap, send)


def spearman(order_a: list[int], order_b: list[int]) -> float:
    """Spearman's ρ between the positions of the same devices in two orders (devices in both only)."""
    common = [d for d in order_a if d in set(order_b)]
    pos_b = {d: i for i, d in enumerate(order_b)}
    if len(common) < 3:
        return 0.0
    return float(stats.spearmanr(np.arange(len(common)), [pos_b[d] for d in common]).statistic)


def right_pairs(order_a: list[int], order_b: list[int]) -> int:
    """How many devices the k-th-with-k-th pairing of two orders gets right."""
    return sum(a == b for a, b in zip(order_a, order_b, strict=False))


def assert_chance(what: str, order_a: list[int], order_b: list[int], found: dict[str, Any]) -> None:
    n = len(set(order_a) & set(order_b))
    rho, pairs = spearman(order_a, order_b), right_pairs(order_a, order_b)
    found[what] = {"devices": n, "rho": round(rho, 3), "right_pairs": pairs}
    assert n >= 0.3 * N_DEVICES, (what, found)  # mid-round: about half reported (Binomial(N, 1/2) < 0.3 N: ~1e-8)
    assert pairs <= MAX_PAIRS, f"{what}: the operator paired {pairs} of {n} devices right (chance: about 1); {found}"
    assert abs(rho) <= Z_RHO / (n - 1) ** 0.5, f"{what}: rank correlation {rho:.3f} over {n} devices; {found}"


def stored_orders(store_url: str, copy: Path, rid_num: int) -> tuple[list[str], list[str]]:
    """(token holders in storage order, message ids in storage order) of a copy of the database."""
    if store_url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(copy)) as db:
            holders = [r[0] for r in db.execute("SELECT holder FROM token_issuance WHERE round_num = ?",
                                                (rid_num,))]  # storage order (WITHOUT ROWID: key order)
            ids = [r[0] for r in db.execute("SELECT message_id FROM messages_recent WHERE round_num = ? ORDER BY seq",
                                            (rid_num,))]
            ids += [r[0] for r in db.execute("SELECT message_id FROM messages WHERE round_num = ?", (rid_num,))]
        return holders, ids
    import psycopg
    with psycopg.connect(store_url.replace("postgresql+psycopg://", "postgresql://")) as db:
        holders = [r[0] for r in db.execute("SELECT holder FROM token_issuance WHERE round_num = %s ORDER BY ctid",
                                            (rid_num,))]
        ids = [r[0] for r in db.execute("SELECT message_id FROM messages WHERE round_num = %s ORDER BY ctid",
                                        (rid_num,))]
    return holders, ids


def snapshot(store_url: str, dest: Path) -> Path:
    """The operator's copy of the database (SQLite: an online backup; PostgreSQL: read in place, by ctid)."""
    if store_url.startswith("sqlite"):
        src = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        with contextlib.closing(src), contextlib.closing(sqlite3.connect(dest)) as dst:
            src.backup(dst)
    return dest


@contextlib.contextmanager
def relay_in_front(url: str, use_relay: bool) -> Iterator[str | None]:
    if not use_relay:
        yield None
        return
    from hybriddp.relay import create_relay_app
    with local_server(create_relay_app(url)) as relay_url:
        yield relay_url


def test_an_operator_with_its_access_log_and_database_links_no_more_than_chance(store_url: str,
                                                                               tmp_path: Path) -> None:
    attack(store_url, tmp_path, use_relay=False)


def test_through_a_relay_the_operator_links_no_more_than_chance(tmp_path: Path) -> None:
    attack(f"sqlite:///{tmp_path / 'relayed.db'}", tmp_path, use_relay=True)


def attack(store_url: str, tmp_path: Path, *, use_relay: bool) -> None:
    """Run the round with N_DEVICES devices and every attack of the module's docstring on what the operator kept."""
    log = AccessLog(create_app(store_url, ADMIN))
    found: dict[str, Any] = {"machine slowdown": slowdown()}
    issuance_s = ISSUANCE_S * found["machine slowdown"]
    with local_server(log) as url, relay_in_front(url, use_relay) as relay_url:
        admin = AdminClient(url, ADMIN)
        rid = admin.create_round("blender", {"epsilon": 4.0, "head_list_size": 4, "issuance_seconds": issuance_s,
                                             "report_seconds": REPORT_S})["id"]
        opt = admin.enrol_many(rid, [f"optin-{i}" for i in range(400)])
        OptinRelay(url, rid).upload_many([(t, [OPTIN[i % len(OPTIN)]]) for i, t in enumerate(opt)])
        admin.publish_headlist(rid)
        creds = [c["credential"] for c in admin.create_credentials(N_DEVICES)]
        cred_of = {hashlib.sha256(f"Bearer {c}".encode()).hexdigest(): i for i, c in enumerate(creds)}
        start = time.monotonic()
        message_of: dict[str, int] = {}
        late: dict[int, bool] = {}  # devices that got their token after the report window opened (a loaded machine)
        lock = threading.Lock()

        def device(i: int) -> None:
            time.sleep(max(0.0, start + i * STAGGER_S - time.monotonic()))
            outbox = tmp_path / f"outbox-{i}.json"
            with DeviceClient(url, rid, DeviceClient.NO_LEDGER, outbox=outbox, credential=creds[i],
                              relay=relay_url) as dev:
                ack = dev.participate([OPTIN[i % len(OPTIN)]], wait=False)
                with lock:
                    message_of[json.loads(outbox.read_text())["message"]["id"]] = i
                    late[i] = not ack.pending or time.monotonic() > start + issuance_s
                sent = dev.send_due(wait=True)
                assert sent is not None and sent.counted == 1

        with ThreadPoolExecutor(N_DEVICES) as pool:
            jobs = [pool.submit(device, i) for i in range(N_DEVICES)]
            time.sleep(max(0.0, start + issuance_s + REPORT_S / 2 - time.monotonic()))
            mid = snapshot(store_url, tmp_path / "mid-round.db")
            mid_orders = stored_orders(store_url, mid, _round_num(store_url, rid))
            for job in jobs:
                job.result()
        assert admin.round(rid)["counts"]["messages"] == N_DEVICES
        found["devices with a late token"] = sum(late.values())
        admin.close(rid)
        after = stored_orders(store_url, snapshot(store_url, tmp_path / "after-close.db"), _round_num(store_url, rid))

    # the access log: token requests carry a credential; the report requests' bodies are scored by their ids
    tokens_log = [(t, client, cred_of[h]) for t, client, method, path, h in log.rows
                  if path.endswith("/tokens") and h in cred_of]
    reports_log = [(t, client, [message_of[m] for m in log.report_ids.get(k, []) if m in message_of])
                   for k, (t, client, method, path, _) in enumerate(log.rows)
                   if path.endswith("/reports") or path == "/ohttp"]
    issuance_order = [d for _, _, d in sorted(tokens_log)]
    if use_relay:  # the operator sees only the relay's connections and encrypted requests
        assert not tokens_log and not log.report_ids, "through the relay, the operator's log holds no credential"
        clients = {client[0] for _, client, _ in reports_log if client}
        assert clients <= {"127.0.0.1"} and len(reports_log) >= 2 * N_DEVICES
    else:
        assert sorted(issuance_order) == list(range(N_DEVICES))
        report_order = [d for _, _, ds in sorted(reports_log) for d in ds]
        assert sorted(report_order) == list(range(N_DEVICES))
        assert_chance("access log: k-th token request with k-th report request", issuance_order, report_order, found)
        port_of = {d: client for _, client, d in tokens_log}
        same_conn = sum(1 for _, client, ds in reports_log for d in ds if client == port_of.get(d))
        found["access log: same connection"] = same_conn
        assert same_conn <= MAX_PAIRS, f"reports on their token request's connection: {same_conn}; {found}"
    # the database: storage order of issuance records against storage order of reports, mid-round and after close
    for when, (holders, ids) in (("mid-round copy", mid_orders), ("copy after close", after)):
        token_order = [int(h.split(":")[1]) - 1 for h in holders]  # credential:<id>, ids from 1 in creation order
        stored = [message_of[m] for m in ids if m in message_of]
        if when == "copy after close":
            assert sorted(stored) == list(range(N_DEVICES))
        assert sorted(token_order) == list(range(N_DEVICES)) or use_relay
        assert_chance(f"database, {when}: k-th issuance row with k-th stored report", token_order, stored, found)
    print(found)


def _round_num(store_url: str, rid: str) -> int:
    from hybriddp.service.store import Store
    store = Store(store_url)
    try:
        return store.round(rid).num
    finally:
        store.close()


def test_sqlite_keeps_issuance_counts_in_key_order_not_in_the_order_of_issuance(tmp_path: Path) -> None:
    """``token_issuance`` is a WITHOUT ROWID table on SQLite (migration 0010): a copy of the file lists the holders
    in key order, whatever order they asked in, and has no rowid to sort by."""
    from hybriddp.service.store import Store
    from storehelpers import published_round
    path = tmp_path / "order.db"
    store = Store(f"sqlite:///{path}")
    try:
        info = published_round(store)
        asked = [f"credential:{i}" for i in (7, 3, 9, 1, 5)]
        for holder in asked:
            store.charge_tokens(holder, 1, info, 1)
    finally:
        store.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        stored = [r[0] for r in db.execute("SELECT holder FROM token_issuance")]
        assert stored == sorted(asked) != asked
        with pytest.raises(sqlite3.OperationalError, match="rowid"):
            db.execute("SELECT rowid FROM token_issuance")
