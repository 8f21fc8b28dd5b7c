"""Opt-in users' own uploads through the group commit of :class:`~hybriddp.service.writer.OptinWriter` (issue 39's
single uploads): tokens resolved for a whole group in its one transaction, each request acknowledged, refused alone
or sent the long way (None), and, through a real server, no read transaction of its own per upload."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from test_api import ADMIN, API

from asyncrun import run_async
from hybriddp.service import create_app
from hybriddp.service.errors import ConflictError, QuotaError
from hybriddp.service.store import Store, TokenUpload, UploadAck, open_store, token_hash
from uvicornhelpers import served

PARAMS = {"epsilon": 4.0, "delta": 1e-5, "head_list_size": 10, "m_o": 1, "m_c": 1}
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}


def own(store: Store, token: str, records: list[tuple[str, str]], upload_id: str | None = None) -> TokenUpload:
    return TokenUpload(token_hash(token), records, store.upload_key(upload_id, records), 100)


class Counted:
    """Counts the store's read and write transactions (wraps its ``_read`` and ``_write``)."""

    def __init__(self, store: Store) -> None:
        self.reads = self.writes = 0
        read, write = store._read, store._write

        def counted_read(fn: Any) -> Any:
            self.reads += 1
            return read(fn)

        def counted_write(fn: Any) -> Any:
            self.writes += 1
            return write(fn)
        store._read, store._write = counted_read, counted_write  # type: ignore[method-assign]


def test_one_transaction_resolves_and_stores_a_group(store_url: str) -> None:
    """A group of requests of two rounds: acknowledged, refused alone (quota), repeated (within the group, and
    stored before), or None (a token unknown, or of the other round): stored exactly as acknowledged, by one
    write transaction."""
    with open_store(store_url, optin_max_records=3) as store:
        a = store.create_round("blender", None, {**PARAMS, "url_level": True})
        b = store.create_round("blender", None, {**PARAMS, "url_level": True})
        ta, tb = store.enrol_many(a.id, ["u0", "u1", "u2"]), store.enrol_many(b.id, ["v0"])
        r2 = [("q", "u"), ("r", "v")]
        assert store.add_token_uploads([(a, [own(store, ta[2], [("s", "w")], "before")])]) == [UploadAck(1, 0)]
        counted = Counted(store)
        out = store.add_token_uploads([
            (a, [own(store, ta[0], r2)]),                   # stored
            (a, [own(store, "not-a-token", r2)]),           # unknown: None
            (a, [own(store, tb[0], r2)]),                   # a token of round b: None
            (a, [own(store, ta[1], r2 + r2)]),              # 4 records over the quota of 3: refused alone
            (a, [own(store, ta[0], r2)]),                   # the same upload again in the group: a duplicate
            (a, [own(store, ta[2], [("s", "w")], "before")]),  # stored before: a duplicate
            (b, [own(store, tb[0], [("x", "y")])]),         # the other round's request
        ])
        assert counted.writes == 1 and counted.reads == 0
        assert out[0] == UploadAck(2, 0) and out[1] is None and out[2] is None
        assert isinstance(out[3], QuotaError) and "quota of 3 records" in str(out[3])
        assert out[4] == UploadAck(0, 2) and out[5] == UploadAck(0, 1) and out[6] == UploadAck(1, 0)
        _, queries, urls, _ = store.optin_records(a.num)
        assert sorted(zip(queries, urls, strict=True)) == [("q", "u"), ("r", "v"), ("s", "w")]
        assert store.optin_records(b.num)[1] == ["x"]


def test_a_round_that_stopped_taking_uploads_refuses_the_group_request(store_url: str) -> None:
    """The round's state is checked in the group's transaction, not taken from the remembered round: an upload
    whose round left collecting-optin is refused (409) or, its tokens deleted, sent the long way (None)."""
    with open_store(store_url) as store:
        info = store.create_round("blender", None, {**PARAMS, "url_level": True})
        tokens = store.enrol_many(info.id, ["u0"])
        store.optin_users(info.id, tokens)
        assert (checked := store.checked_round(info.id)) is not None and checked.num == info.num
        store.abort(info.id)
        assert store.add_token_uploads([(info, [own(store, tokens[0], [("q", "u")])])]) == [None]
        with open_store(store_url) as other:  # a conflict seen in the transaction itself (state changed under it)
            info2 = other.create_round("blender", None, {**PARAMS, "url_level": True})
            t2 = other.enrol_many(info2.id, ["u0"])
            with other.engine.begin() as conn:
                conn.exec_driver_sql(f"UPDATE rounds SET state = 'building-headlist' WHERE num = {info2.num}")
            (refusal,) = other.add_token_uploads([(info2, [own(other, t2[0], [("q", "u")])])])
            assert isinstance(refusal, ConflictError) and "'building-headlist'" in str(refusal)


def test_own_uploads_through_a_server_open_no_transaction_of_their_own(tmp_path: Path) -> None:
    """200 users each upload once, concurrently, to a running server: after the round's first token check, no
    upload opens a read transaction, the uploads share write transactions (group commits), and every record is
    stored once; a repeat is acknowledged as a duplicate. Before the opt-in writer, each upload read its token in a
    transaction of its own and waited for a group commit in a thread of its own."""
    app = create_app(f"sqlite:///{tmp_path / 'w.db'}", ADMIN, open_admission=True)
    store = app.state.service.store
    with served(app) as url, httpx.Client(base_url=url + API, headers=ADMIN_AUTH, timeout=60) as http:
        rid = http.post("/rounds", json={"kind": "blender", "params": PARAMS}).json()["id"]
        tokens = http.post(f"/rounds/{rid}/optin/enrol", json={"users": [f"u{i}" for i in range(200)]}).json()["tokens"]
        docs = [json.dumps({"records": [{"query": f"q{i % 7}", "url": f"https://e.example/{i}"}]}).encode()
                for i in range(200)]
        first = http.post(f"/rounds/{rid}/optin/records", content=docs[0],
                          headers={"Authorization": f"Bearer {tokens[0]}", "Content-Type": "application/json"})
        assert first.json() == {"accepted": 1, "duplicates": 0}
        counted = Counted(store)

        async def send_all() -> list[Any]:
            async with httpx.AsyncClient(base_url=url + API, timeout=60,
                                         limits=httpx.Limits(max_connections=32)) as ah:
                return await asyncio.gather(*(ah.post(f"/rounds/{rid}/optin/records", content=docs[i], headers={
                    "Authorization": f"Bearer {tokens[i]}", "Content-Type": "application/json"})
                    for i in [*range(1, 200), 5]))
        answers = run_async(send_all())  # its own thread: Playwright may hold this thread's loop
        assert [r.status_code for r in answers] == [200] * 200
        assert sum(r.json()["accepted"] for r in answers) == 199
        assert sum(r.json()["duplicates"] for r in answers) == 1
        assert counted.reads == 0 and 1 <= counted.writes <= 200
        urls = store.optin_records(store.round(rid).num)[2]
        assert sorted(urls) == sorted(f"https://e.example/{i}" for i in range(200))
