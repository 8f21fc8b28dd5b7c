"""Report protocol v2 (spec-v2, docs/TOKENS.md, issue 38): its promises against an operator, attacked.

* The head list a service publishes commits to the round's token key (key id, 2048 bits, e = 65537) and to its
  report window, inside its content hash; the estimates document is bound to that hash; a series period's window
  ends before the period closes.
* Key tagging (issue 38, attack 3): a hostile server that hands each connection its own key (and re-signs the
  tokens under the real key, so that its tagged reports are counted) is refused by the shipped ``DeviceClient``
  before any report leaves; one that also hands each device its own head list is caught by a mirror. A device
  that does not check the commitment is tagged: the control that the attack is real.
* ``min_tokens``: reports wait (409 too_few_tokens, Retry-After) until that many tokens were issued; the SDK
  keeps the message in its outbox and sends it later.
* The SDK's schedule: a message is kept and sent at a time in the report window, not before; the token request
  and the report go on different connections. ``tokens.report_time`` is uniform where it should be (KS test).

(Spending — a retry counts once, a second message with the same token is a duplicate, a message whose id is not
the derived one or a token of another round is refused — is in test_tokens.py.)
"""

from __future__ import annotations

import asyncio
import datetime
import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.testclient import TestClient
from test_api import ADMIN, API, AUTH, PARAMS, blender_round, create, device_messages, error_of, optin_all
from test_tokens import counted, credentials, post, published_mean_round, with_token

from hybriddp.core import blindrsa, tokens
from hybriddp.core.errors import DataError, HybridDPError
from hybriddp.core.protocol import content_hash
from hybriddp.sdk import DeviceClient
from hybriddp.sdk.http import ConflictError, ServiceRequestError
from hybriddp.service import create_app
from hybriddp.service.demo import local_server
from hybriddp.service.store import open_store

RECORDS = [("weather", "https://w.example/a")]


@pytest.fixture
def client(store_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(store_url, ADMIN)) as c:  # admission on: the default
        yield c


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """The attacks are on the device: one database is enough."""
    return f"sqlite:///{tmp_path / 'hybriddp.db'}"


# ----- what a published head list commits to -------------------------------------------------------------
def _published(client: TestClient, params: dict[str, Any]) -> tuple[str, dict[str, Any], float, float]:
    rid = create(client, params=params)
    optin_all(client, rid)
    before = time.time()
    assert client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).status_code == 200
    return rid, client.get(f"{API}/rounds/{rid}/headlist").json(), before, time.time()


def test_the_head_list_commits_to_the_round_key_and_its_report_window(client: TestClient, store_url: str) -> None:
    rid, hl, before, after = _published(client, {**PARAMS, "issuance_seconds": 600, "report_seconds": 1200})
    key_doc = client.get(f"{API}/rounds/{rid}/token-key").json()
    assert hl["token_key"] == {"key_id": key_doc["key_id"], "modulus_bits": 2048, "e": 65537}
    key = tokens.RoundKey.from_dict(key_doc, rid, hl["token_key"])
    assert tokens.b64(key.key_id) == key_doc["key_id"]
    assert key.public_key.key_size == 2048 and key.public_key.public_numbers().e == 65537
    # the window opens issuance_seconds after publication and lasts report_seconds (whole seconds, UTC "Z")
    assert hl["report_window"]["opens"].endswith("Z") and hl["report_window"]["closes"].endswith("Z")
    opens, closes = tokens.report_window(hl)
    assert int(before) + 600 <= opens <= after + 600 and closes - opens == pytest.approx(1200, abs=1)
    # all of it inside the content hash: a head list committing to another key is another document
    assert hl["content_hash"] == content_hash(hl) == client.get(f"{API}/rounds/{rid}").json()["headlist_hash"]
    other = tokens.b64(blindrsa.token_key_id(tokens.new_private_key().public_key()))
    assert content_hash({**hl, "token_key": {**hl["token_key"], "key_id": other}}) != hl["content_hash"]
    assert content_hash({**hl, "report_window": {**hl["report_window"], "opens": hl["report_window"]["closes"]}}) \
        != hl["content_hash"]
    # the estimates document is bound to the new hash (and its own hash recomputed)
    with open_store(store_url) as store:
        docs = store.documents(rid)
        _, stored, _ = store.round_key(rid)
    estimates = json.loads(docs.estimates)
    assert estimates["headlist"] == hl["content_hash"] and estimates["content_hash"] == content_hash(estimates)
    assert stored.key_id == key.key_id  # the stored key is the committed one
    # the defaults: an hour of issuance, an hour of reports
    _, hl2, before2, after2 = _published(client, PARAMS)
    opens2, closes2 = tokens.report_window(hl2)
    assert int(before2) + 3600 <= opens2 <= after2 + 3600 and closes2 - opens2 == pytest.approx(3600, abs=1)
    assert hl2["token_key"]["key_id"] != hl["token_key"]["key_id"]  # one key per round


def test_a_mean_round_document_commits_too(client: TestClient, store_url: str) -> None:
    rid = published_mean_round(client, report_seconds=60)
    doc = client.get(f"{API}/rounds/{rid}/headlist").json()
    key = tokens.RoundKey.from_dict(client.get(f"{API}/rounds/{rid}/token-key").json(), rid, doc["token_key"])
    assert doc["token_key"] == key.committed() and doc["content_hash"] == content_hash(doc)
    opens, closes = tokens.report_window(doc)
    assert closes - opens == pytest.approx(60, abs=1)
    with open_store(store_url) as store:
        estimates = json.loads(store.documents(rid).estimates)
    assert estimates["headlist"] == doc["content_hash"] and estimates["content_hash"] == content_hash(estimates)


def test_a_series_period_report_window_ends_before_the_period_closes(store_url: str) -> None:
    """Windows longer than the period are shrunk: the devices' last reports still arrive before the close."""
    with TestClient(create_app(store_url, ADMIN, series_tick=0)) as c:
        params = {**PARAMS, "issuance_seconds": 5 * 86400.0, "report_seconds": 5 * 86400.0}
        resp = c.post(f"{API}/series", json={"kind": "blender", "params": params, "period_seconds": 86400,
                                             "periods": 2}, headers=AUTH)
        assert resp.status_code == 201, resp.text
        sid = resp.json()["id"]
        doc = c.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=AUTH).json()
        rid = doc["periods_table"][0]["round"]["id"]
        optin_all(c, rid)
        before = time.time()
        doc = c.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=AUTH).json()
        row = doc["periods_table"][0]
        assert row["round"]["state"] == "headlist-published", row
        hl = c.get(f"{API}/rounds/{rid}/headlist").json()
    opens, closes = tokens.report_window(hl)
    ends = datetime.datetime.fromisoformat(row["ends"].replace("Z", "+00:00")).timestamp()
    assert int(before) <= opens < closes < ends, (hl["report_window"], row)
    assert hl["content_hash"] == content_hash(hl) and hl["token_key"]["modulus_bits"] == 2048


def test_keys_other_than_2048_bits_and_e_65537_are_refused_even_when_committed() -> None:
    rid = "rnd-keys"
    for bad, needle in ((rsa.generate_private_key(3, 2048), "exponent"),
                        (rsa.generate_private_key(65537, 1024), "2048"),
                        (rsa.generate_private_key(65537, 3072), "2048")):  # token type 2: exactly 2048 bits
        rk = tokens.round_key(rid, bad)
        doc = {**rk.to_dict(), "admission": "tokens"}
        with pytest.raises(DataError, match=needle):
            tokens.RoundKey.from_dict(doc, rid, rk.committed())
        if bad.key_size <= 2048:  # the commitment check alone too (it takes a committed size of 2048 bits or more)
            with pytest.raises(DataError, match=needle if needle == "exponent" else "bits"):
                tokens.check_committed_key(rk, rk.committed())
    good = tokens.round_key(rid, tokens.new_private_key())
    tokens.RoundKey.from_dict({**good.to_dict(), "admission": "tokens"}, rid, good.committed())  # the control
    for committed in ({**good.committed(), "e": 3}, {**good.committed(), "modulus_bits": 1024},
                      {**good.committed(), "modulus_bits": 4096}, {**good.committed(), "modulus_bits": True}):
        with pytest.raises(DataError):
            tokens.RoundKey.from_dict({**good.to_dict(), "admission": "tokens"}, rid, committed)
    with pytest.raises(DataError, match="commits to no token key"):  # a head list without the field
        tokens.check_committed_key(good, None)


# ----- a hostile server tags devices by key -------------------------------------------------------------
async def _read(receive: Any) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            break
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    return b"".join(chunks)


async def _answer(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


async def _call(app: Any, scope: dict[str, Any], body: bytes) -> tuple[int, bytes]:
    """The inner app's answer to a request with this body (status, body)."""
    given = False
    out: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        nonlocal given
        if given:
            await asyncio.sleep(3600)
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            out["status"] = msg["status"]
        else:
            out["body"] += msg.get("body", b"")
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-length", b"if-none-match")]
    await app({**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}, receive, send)
    return out["status"], out["body"]


class TaggingServer:
    """The real service behind an operator's middleware (issue 38, attack 3). It hands every connection that asks
    for the round's token key a key of its own (``make_key``), signs token requests with the last key handed out
    (the device's: the tests run one device at a time), and re-signs every token of a report under the real key,
    rewriting nothing else, so that the real service counts the report; ``tags`` records which handed-out key each
    report's token was under: which device sent it. With ``own_headlists``, the head list served to a connection
    commits to that connection's key (content hash and ETag recomputed); with ``uncommitted``, to none (one
    document for all, so that a mirror of it would agree). ``/mirror/...`` serves the real documents
    (a second path, as a relay would). ``reports``: the POSTs to /reports it saw; ``clients``: (method, path
    tail, client address) of every request."""

    def __init__(self, app: Any, rid: str, real: rsa.RSAPrivateKey, *, own_headlists: bool = False,
                 uncommitted: bool = False,
                 make_key: Callable[[], rsa.RSAPrivateKey] = tokens.new_private_key) -> None:
        self.app, self.rid, self.own_headlists, self.make_key = app, rid, own_headlists or uncommitted, make_key
        self.uncommitted = uncommitted
        self.real = tokens.round_key(rid, real)
        self.real_private = real
        self.by_connection: dict[Any, int] = {}
        self.keys: list[rsa.RSAPrivateKey] = []
        self.hashes: dict[str, str] = {}  # a head list made for a device -> the real one
        self.reports = 0
        self.tags: list[int] = []
        self.clients: list[tuple[str, str, Any]] = []

    def key_for(self, scope: dict[str, Any]) -> int:
        conn = tuple(scope["client"])
        if conn not in self.by_connection:
            self.keys.append(self.make_key())
            self.by_connection[conn] = len(self.keys) - 1
        return self.by_connection[conn]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"], scope["method"]
        if path.startswith("/mirror/"):
            inner = path[len("/mirror"):]
            return await self.app({**scope, "path": inner, "raw_path": inner.encode()}, receive, send)
        tail = path.rsplit("/", 1)[-1]
        self.clients.append((method, tail, tuple(scope["client"])))
        if method == "GET" and tail == "token-key":
            rk = tokens.round_key(self.rid, self.keys[self.key_for(scope)])
            return await _answer(send, 200, orjson.dumps({**rk.to_dict(), "admission": "tokens"}))
        if method == "GET" and tail == "headlist" and self.own_headlists:
            status, body = await _call(self.app, scope, b"")
            doc = json.loads(body)
            rk = tokens.round_key(self.rid, self.keys[self.key_for(scope)])
            mine = ({k: v for k, v in doc.items() if k != "token_key"} if self.uncommitted
                    else {**doc, "token_key": rk.committed()})
            mine["content_hash"] = content_hash(mine)
            self.hashes[mine["content_hash"]] = doc["content_hash"]
            return await _answer(send, status, orjson.dumps(mine), [(b"etag", f'"{mine["content_hash"]}"'.encode())])
        if method == "POST" and tail == "tokens":
            blinded = json.loads(await _read(receive))["blinded_msgs"]
            key = self.keys[-1]
            sigs = [tokens.b64(blindrsa.blind_sign(key, tokens.unb64(b, "b"))) for b in blinded]
            return await _answer(send, 200, orjson.dumps({"blind_sigs": sigs, "remaining": 0, "key_id": tokens.b64(
                blindrsa.token_key_id(key.public_key()))}))
        if method == "POST" and tail == "reports":
            self.reports += 1
            body = json.loads(await _read(receive))
            msgs = [self.resign(m) for m in (body if isinstance(body, list) else [body])]
            status, out = await _call(self.app, scope, orjson.dumps(msgs))
            return await _answer(send, status, out)
        return await self.app(scope, receive, send)

    def resign(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The message with its token re-signed under the real key (same nonce, so the same derived id), after
        noting which handed-out key it was under."""
        tok = tokens.Token.parse(msg["token"])
        ids = [blindrsa.token_key_id(k.public_key()) for k in self.keys]
        if tok.key_id not in ids:
            return msg
        tag = ids.index(tok.key_id)
        assert blindrsa.verify(self.keys[tag].public_key(), tok.signed_input, tok.authenticator,
                               variant=tokens.VARIANT)
        self.tags.append(tag)
        req = tokens.TokenRequest.make(self.real, tok.nonce)
        sig = blindrsa.blind_sign(self.real_private, tokens.unb64(req.blinded, "b"))
        out = {**msg, "token": req.finalize(tokens.b64(sig))}
        if msg.get("headlist") in self.hashes:
            out["headlist"] = self.hashes[msg["headlist"]]
        return out


def _hostile_round(store_url: str) -> tuple[str, rsa.RSAPrivateKey, list[str]]:
    with TestClient(create_app(store_url, ADMIN)) as c:
        rid, _ = blender_round(c)
        creds = credentials(c, 4)
    with open_store(store_url) as store:
        _, _, private = store.round_key(rid, private=True)
    assert private is not None
    return rid, private, creds


def _naive_device(url: str, rid: str, records: list[tuple[str, str]]) -> dict[str, Any]:
    """A device that takes whatever key the server gives it, without the head list's commitment: what the
    shipped client must not be."""
    from hybriddp.device.localalg import randomize_records
    with httpx.Client(base_url=url) as http:
        hl = http.get(f"{API}/rounds/{rid}/headlist").json()
        key = tokens.RoundKey.from_dict(http.get(f"{API}/rounds/{rid}/token-key").json(), rid)  # no commitment
        req = tokens.TokenRequest.make(key)
        sig = http.post(f"{API}/rounds/{rid}/tokens", json={"blinded_msgs": [req.blinded]}).json()["blind_sigs"][0]
        msg = tokens.spend(randomize_records(hl, records), req.finalize(sig))
        return http.post(f"{API}/rounds/{rid}/reports", json=msg).json()


def test_a_server_tagging_devices_by_key_is_refused_before_any_report_leaves(sqlite_url: str) -> None:
    rid, private, creds = _hostile_round(sqlite_url)
    hostile = TaggingServer(create_app(sqlite_url, ADMIN), rid, private)
    with local_server(hostile) as url:
        # the control: a device that does not check the commitment is tagged, and its report counted
        assert _naive_device(url, rid, RECORDS)["counted"] == 1
        assert hostile.reports == 1 and hostile.tags == [0]
        # the shipped client: refused, naming the key, nothing sent
        asked = sum(c[1] == "tokens" for c in hostile.clients)
        dev = DeviceClient(url, rid, DeviceClient.NO_LEDGER, credential=creds[0], report_now=True)  # at once: a test
        with pytest.raises(ServiceRequestError, match="not the key the head list commits to") as info:
            dev.participate(RECORDS)
        tagged = tokens.b64(blindrsa.token_key_id(hostile.keys[-1].public_key()))
        assert tagged[:12] in str(info.value) and "Nothing was sent" in str(info.value)
        # not even a token was asked for
        assert hostile.reports == 1 and sum(c[1] == "tokens" for c in hostile.clients) == asked
        with pytest.raises(ServiceRequestError, match="not the key"):
            DeviceClient(url, rid, DeviceClient.NO_LEDGER, credential=creds[1], report_now=True).token_key()
    assert hostile.reports == 1


def test_a_server_handing_each_device_its_own_head_list_is_caught_by_a_mirror(sqlite_url: str) -> None:
    rid, private, creds = _hostile_round(sqlite_url)
    hostile = TaggingServer(create_app(sqlite_url, ADMIN), rid, private, own_headlists=True)
    with local_server(hostile) as url:
        # without a mirror the attack works: two devices, two keys, each committed in its own head list; the server
        # knows which report is whose (the control)
        for i in range(2):
            dev = DeviceClient(url, rid, DeviceClient.NO_LEDGER, credential=creds[i], report_now=True)  # a test
            assert dev.participate(RECORDS).counted == 1
        assert hostile.reports == 2 and hostile.tags == [0, 1] and len(hostile.hashes) == 2
        # with a mirror (a second path to the real documents): refused, nothing sent, not even a token asked for
        asked = sum(c[1] == "tokens" for c in hostile.clients)
        dev = DeviceClient(url, rid, DeviceClient.NO_LEDGER, credential=creds[2], report_now=True,
                           mirror=f"{url}/mirror")
        with pytest.raises(ServiceRequestError, match="the mirror sees") as info:
            dev.participate(RECORDS)
        assert "Nothing was sent" in str(info.value) and dev.headlist_cached is not None
        assert dev.headlist_cached["content_hash"][:19] in str(info.value)
        assert hostile.reports == 2 and sum(c[1] == "tokens" for c in hostile.clients) == asked
        # and with a mirror, the honest documents pass: the same device against the mirror path itself
        honest = DeviceClient(f"{url}/mirror", rid, DeviceClient.NO_LEDGER, credential=creds[3], report_now=True,
                              mirror=f"{url}/mirror")
        assert honest.token_key()[0].key_id == hostile.real.key_id


def test_a_committed_key_with_another_exponent_or_size_is_refused_by_the_device(sqlite_url: str) -> None:
    rid, private, creds = _hostile_round(sqlite_url)
    for make, needle in ((lambda: rsa.generate_private_key(3, 2048), "65537"),
                         (lambda: rsa.generate_private_key(65537, 1024), "2048")):
        hostile = TaggingServer(create_app(sqlite_url, ADMIN), rid, private, own_headlists=True, make_key=make)
        with local_server(hostile) as url:
            dev = DeviceClient(url, rid, DeviceClient.NO_LEDGER, credential=creds[0], report_now=True)  # a test
            # the head list's check (validate_headlist) or the key's (RoundKey.from_dict), whichever comes first
            with pytest.raises(HybridDPError, match=needle):
                dev.participate(RECORDS)
        assert hostile.reports == 0 and not [c for c in hostile.clients if c[1] == "tokens"]


def test_a_head_list_committing_to_no_key_is_refused_by_the_device(sqlite_url: str) -> None:
    """Without the field, every device would take any key, and one head list for all would pass a mirror."""
    rid, private, creds = _hostile_round(sqlite_url)
    hostile = TaggingServer(create_app(sqlite_url, ADMIN), rid, private, uncommitted=True)
    with local_server(hostile) as url:
        dev = DeviceClient(url, rid, DeviceClient.NO_LEDGER, credential=creds[0], report_now=True)  # a test
        with pytest.raises(ServiceRequestError, match="commits to no token key"):
            dev.participate(RECORDS)
        assert "token_key" not in (dev.headlist_cached or {"token_key": 1})
    assert hostile.reports == 0 and not [c for c in hostile.clients if c[1] == "tokens"]


# ----- min_tokens -----------------------------------------------------------------------------------------
def test_reports_wait_until_min_tokens_were_issued(store_url: str, tmp_path: Path) -> None:
    with TestClient(create_app(store_url, ADMIN)) as c, local_server(create_app(store_url, ADMIN)) as url:
        creds = credentials(c, 3)
        rid, hl = blender_round(c, {**PARAMS, "min_tokens": 3})
        m1 = with_token(c, rid, creds[0], device_messages(hl, 1, seed=11)[0])
        resp = post(c, rid, m1)
        error_of(resp, 409, "too_few_tokens", "3 report tokens", "1 were")
        assert float(resp.headers["retry-after"]) > 0
        # the SDK keeps its message (with its token) in the outbox
        outbox = tmp_path / "outbox.json"
        dev = DeviceClient(url, rid, DeviceClient.NO_LEDGER, outbox=outbox, credential=creds[1],
                           report_now=True)  # at once: a test of min_tokens, not of the schedule
        with pytest.raises(ConflictError) as info:
            dev.participate(RECORDS)
        assert info.value.code == "too_few_tokens" and info.value.status == 409
        kept = json.loads(outbox.read_text())["message"]
        assert kept["id"] == tokens.Token.parse(kept["token"]).message_id
        assert counted(c, rid) == 0
        # the third token is issued: reports are taken, the kept message is sent by send_due
        m3 = with_token(c, rid, creds[2], device_messages(hl, 1, seed=12)[0])
        ack = dev.send_due()
        assert ack is not None and (ack.counted, ack.duplicates) == (1, 0) and not outbox.exists()
        assert dev.send_due() is None
        assert post(c, rid, [m1, m3]).json() == {"acknowledged": 2, "counted": 2, "duplicates": 0}
        assert counted(c, rid) == 3


def test_a_kept_message_is_sent_by_a_later_participate_once_min_tokens_are_reached(store_url: str,
                                                                                  tmp_path: Path) -> None:
    with TestClient(create_app(store_url, ADMIN)) as c, local_server(create_app(store_url, ADMIN)) as url:
        creds = credentials(c, 2)
        rid, hl = blender_round(c, {**PARAMS, "min_tokens": 2})
        outbox = tmp_path / "outbox.json"
        with pytest.raises(ConflictError, match="too_few_tokens"):
            DeviceClient(url, rid, DeviceClient.NO_LEDGER, outbox=outbox, credential=creds[0],
                         report_now=True).participate(RECORDS)  # at once: a test
        kept = json.loads(outbox.read_text())["message"]
        with_token(c, rid, creds[1], device_messages(hl, 1, seed=13)[0])
        # a new client object (a later run): the same message and token, not a new token (the credential has none)
        ack = DeviceClient(url, rid, DeviceClient.NO_LEDGER, outbox=outbox, credential=creds[0],
                           report_now=True).participate(RECORDS)
        assert ack.counted == 1 and not outbox.exists()
        assert post(c, rid, kept).json()["duplicates"] == 1


# ----- the SDK's schedule -----------------------------------------------------------------------------------
class Recorder:
    """The real service behind a middleware that notes (method, path tail, client address) of every request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.seen.append((scope["method"], scope["path"].rsplit("/", 1)[-1], tuple(scope["client"])))
        await self.app(scope, receive, send)

    def of(self, method: str, tail: str) -> list[Any]:
        return [c for m, t, c in self.seen if (m, t) == (method, tail)]


def test_the_sdk_sends_in_the_report_window_on_connections_of_its_own(store_url: str, tmp_path: Path) -> None:
    recorder = Recorder(create_app(store_url, ADMIN))
    with TestClient(create_app(store_url, ADMIN)) as c, local_server(recorder) as url:
        (cred,) = credentials(c)
        rid, hl = blender_round(c, {**PARAMS, "issuance_seconds": 600, "report_seconds": 1200})
        opens, closes = tokens.report_window(hl)
        now = [time.time()]
        outbox = tmp_path / "outbox.json"
        dev = DeviceClient(url, rid, DeviceClient.NO_LEDGER, outbox=outbox, credential=cred, clock=lambda: now[0])
        ack = dev.participate(RECORDS, wait=False)
        assert ack.pending and ack.counted == 0 and ack.send_at is not None and opens <= ack.send_at <= closes
        entry = json.loads(outbox.read_text())
        assert entry["send_at"] == ack.send_at and "token" in entry["message"]
        assert recorder.of("POST", "reports") == [] and len(recorder.of("POST", "tokens")) == 1
        # before its time: nothing sent
        now[0] = ack.send_at - 1.0
        again = dev.send_due()
        assert again is not None and again.pending and again.send_at == ack.send_at
        assert recorder.of("POST", "reports") == [] and counted(c, rid) == 0
        # after it: sent once
        now[0] = ack.send_at + 0.5
        sent = dev.send_due()
        assert sent is not None and (sent.counted, sent.pending, sent.send_at) == (1, False, ack.send_at)
        assert dev.send_due() is None and not outbox.exists()
        assert len(recorder.of("POST", "reports")) == 1 and counted(c, rid) == 1
        # the token request and the report came on connections of their own: not the head list's, not each other's
        (tok_conn,) = recorder.of("POST", "tokens")
        (rep_conn,) = recorder.of("POST", "reports")
        head_conns = set(recorder.of("GET", "headlist") + recorder.of("GET", "token-key"))
        assert tok_conn != rep_conn and tok_conn not in head_conns and rep_conn not in head_conns, recorder.seen


def test_the_sdk_inside_and_after_the_window(store_url: str, tmp_path: Path) -> None:
    with TestClient(create_app(store_url, ADMIN)) as c, local_server(create_app(store_url, ADMIN)) as url:
        creds = credentials(c, 2)
        rid, hl = blender_round(c, {**PARAMS, "issuance_seconds": 600, "report_seconds": 1200})
        opens, closes = tokens.report_window(hl)
        inside = opens + 300.0
        dev = DeviceClient(url, rid, DeviceClient.NO_LEDGER, outbox=tmp_path / "a.json", credential=creds[0],
                           clock=lambda: inside)
        ack = dev.participate(RECORDS, wait=False)
        assert ack.pending and inside <= ack.send_at <= closes
        late = closes + 10.0
        dev2 = DeviceClient(url, rid, DeviceClient.NO_LEDGER, outbox=tmp_path / "b.json", credential=creds[1],
                            clock=lambda: late)
        done = dev2.participate(RECORDS, wait=False)  # after the window: at once
        assert not done.pending and done.counted == 1 and done.send_at == late


# ----- report_time is uniform -----------------------------------------------------------------------------
def test_report_time_is_uniform_in_what_is_left_of_the_window() -> None:
    from scipy.stats import kstest

    rng = random.Random(9578)
    opens, closes, n = 10_000.0, 13_600.0, 4000
    before = [tokens.report_time((opens, closes), 5_000.0, rng.uniform) for _ in range(n)]
    assert all(opens <= t <= closes for t in before)
    assert kstest(before, "uniform", args=(opens, closes - opens)).pvalue > 1e-6
    inside = [tokens.report_time((opens, closes), 12_000.0, rng.uniform) for _ in range(n)]
    assert all(12_000.0 <= t <= closes for t in inside)
    assert kstest(inside, "uniform", args=(12_000.0, closes - 12_000.0)).pvalue > 1e-6
    # the control: the test sees the difference between the two
    assert kstest(inside, "uniform", args=(opens, closes - opens)).pvalue < 1e-6
    # the OS's randomness by default
    osdraws = [tokens.report_time((opens, closes), 0.0) for _ in range(n)]
    assert kstest(osdraws, "uniform", args=(opens, closes - opens)).pvalue > 1e-6
    # after the window, at its close, or without one: exactly now
    for now in (closes, closes + 1e-3, 20_000.0):
        assert tokens.report_time((opens, closes), now, rng.uniform) == now
    assert tokens.report_time(None, 123.5) == 123.5
    # a window of no length still in the future: its one instant (not now, which would send with the token)
    assert tokens.report_time((opens, opens), 0.0) == opens
