"""Report tokens (docs/TOKENS.md), tried as an attacker would, on SQLite and PostgreSQL.

* A report without a token, with a forged one, with another message's or another round's token, is refused (403)
  and nothing of its request is stored; a retried message with its own token is counted once; a token is spent
  by exactly one message.
* Issuance: only admitted credentials, at most their tokens per round (also under concurrent requests), nothing
  of what was signed stored; a revoked credential gets no more.
* Unlinkability: the stored data hold no trace of the issuance beyond a count per credential, and even the whole
  issuance transcript is explained equally well by every pairing of issuances and reports.
* The round's private key leaves the database files when the round closes.
* The device SDK and ``hybriddp participate`` against a real server (Uvicorn).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from test_api import ADMIN, API, AUTH, blender_round, create, device_messages, error_of, rows_of
from test_privacy_soundness import database_files

from hybriddp.core import blindrsa, tokens
from hybriddp.core.protocol import new_message_id
from hybriddp.device.mean import randomize_value
from hybriddp.sdk import AdminClient, DeviceClient
from hybriddp.sdk.http import ServiceRequestError, ServiceUnavailableError
from hybriddp.service import create_app
from hybriddp.service.demo import local_server
from hybriddp.service.store import open_store
from tokenhelpers import tokened


@pytest.fixture
def client(store_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(store_url, ADMIN)) as c:  # admission on: the default
        yield c


def credentials(client: TestClient, count: int = 1, per_round: int = 1) -> list[str]:
    resp = client.post(f"{API}/device-credentials", json={"count": count, "tokens_per_round": per_round},
                       headers=AUTH)
    assert resp.status_code == 201, resp.text
    return [c["credential"] for c in resp.json()["credentials"]]


def key_of(client: TestClient, rid: str) -> tokens.RoundKey:
    resp = client.get(f"{API}/rounds/{rid}/token-key")
    assert resp.status_code == 200 and resp.json()["admission"] == "tokens", resp.text
    return tokens.RoundKey.from_dict(resp.json(), rid, client.get(f"{API}/rounds/{rid}/headlist").json()["token_key"])


def issue(client: TestClient, rid: str, credential: str, reqs: list[tokens.TokenRequest]) -> Any:
    return client.post(f"{API}/rounds/{rid}/tokens", json={"blinded_msgs": [r.blinded for r in reqs]},
                       headers={"Authorization": f"Bearer {credential}"})


def with_token(client: TestClient, rid: str, credential: str, msg: dict[str, Any]) -> dict[str, Any]:
    return tokened(client, API, rid, credential, [msg])[0]


def post(client: TestClient, rid: str, body: Any) -> Any:
    return client.post(f"{API}/rounds/{rid}/reports", json=body)


def counted(client: TestClient, rid: str) -> int:
    return int(client.get(f"{API}/rounds/{rid}").json()["counts"]["messages"])


# ----- redemption ---------------------------------------------------------------------------------
def test_a_report_needs_a_valid_token_and_spends_it(client: TestClient, store_url: str) -> None:
    (cred,) = credentials(client, per_round=3)
    rid, hl = blender_round(client)
    other_rid, _ = blender_round(client)
    m1, m2, m3 = device_messages(hl, 3, seed=1)
    error_of(post(client, rid, m1), 403, "token_required", "field 'token' is missing", "/tokens")
    error_of(post(client, rid, {**m1, "token": "not base64!"}), 403, "token_invalid")
    error_of(post(client, rid, {**m1, "token": tokens.b64(os.urandom(256))}), 403, "token_invalid", "354 bytes")
    t1 = with_token(client, rid, cred, m1)
    assert len(tokens.unb64(t1["token"], "token")) == tokens.TOKEN_BYTES == 354
    parsed = tokens.Token.parse(t1["token"])
    assert t1["id"] == parsed.message_id != m1["id"]
    forged = tokens.Token(parsed.nonce, parsed.challenge_digest, parsed.key_id, os.urandom(256)).encode()
    error_of(post(client, rid, {**t1, "token": forged}), 403, "token_invalid", "does not verify")
    # the token is spent by the message whose id its nonce derives: any other id is refused
    error_of(post(client, rid, {**m2, "token": t1["token"]}), 403, "token_invalid", "derived")
    # m1 sent to another round: its token's challenge names its round
    (cred2,) = credentials(client)
    error_of(post(client, other_rid, {**t1, "headlist": client.get(f"{API}/rounds/{other_rid}/headlist").json()[
        "content_hash"]}), 403, "token_invalid", "another round")
    # a batch with one bad message is refused whole: nothing of it is stored
    t2 = with_token(client, rid, cred, m2)
    error_of(post(client, rid, [t2, m3]), 403, "token_required", "message 2")
    assert counted(client, rid) == 0 and rows_of(store_url, "messages", rid) + rows_of(
        store_url, "messages_recent", rid) == 0
    # the valid ones are counted; a retried message (same id, same token) once
    assert post(client, rid, [t1, t2]).json() == {"acknowledged": 2, "counted": 2, "duplicates": 0}
    assert post(client, rid, t1).json() == {"acknowledged": 1, "counted": 0, "duplicates": 1}
    # another message with the same token (other reports) has the same id: acknowledged as a duplicate, not counted
    other_reports = next(m for m in (m2, m3) if m["reports"] != m1["reports"])
    assert post(client, rid, {**t1, "reports": other_reports["reports"]}).json() == {
        "acknowledged": 1, "counted": 0, "duplicates": 1}
    assert counted(client, rid) == 2
    assert cred2  # a second credential exists and was never used: its tokens are untouched


def published_mean_round(client: TestClient, **params: Any) -> str:
    """A mean round (ε 2 on [0, 10], and ``params``) whose 30 opt-in users uploaded 0..9 and whose document is
    published; its id."""
    rid = create(client, "mean", {"epsilon": 2.0, "lower": 0.0, "upper": 10.0, **params})
    tok = client.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": [f"u{i}" for i in range(30)]},
                      headers=AUTH).json()["tokens"]
    for i, t in enumerate(tok):
        client.post(f"{API}/rounds/{rid}/optin/records", json={"values": [float(i % 10)]},
                    headers={"Authorization": f"Bearer {t}"})
    assert client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).status_code == 200
    return rid


def test_mean_round_reports_need_tokens_too(client: TestClient) -> None:
    (cred,) = credentials(client)
    rid = published_mean_round(client)
    msg = {"id": new_message_id(), "round": rid, "value": randomize_value(3.0, lower=0.0, upper=10.0, epsilon=2.0)}
    error_of(post(client, rid, msg), 403, "token_required")
    good = with_token(client, rid, cred, msg)
    error_of(post(client, rid, {**good, "id": new_message_id()}), 403, "token_invalid", "derived")
    assert post(client, rid, good).json()["counted"] == 1
    # another value under the same token: the same id, a duplicate
    assert post(client, rid, {**good, "value": good["value"] + 1.0}).json() == {
        "acknowledged": 1, "counted": 0, "duplicates": 1}


# ----- issuance -----------------------------------------------------------------------------------
def test_issuance_only_to_admitted_credentials_within_their_limit(client: TestClient) -> None:
    a, b = credentials(client, 2)
    rid, hl = blender_round(client)
    key = key_of(client, rid)
    msgs = device_messages(hl, 4, seed=2)
    reqs = [tokens.TokenRequest.make(key) for _ in msgs]
    for bad in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer hdc_not-a-credential"},
                {"Authorization": f"Bearer {ADMIN}"}):
        resp = client.post(f"{API}/rounds/{rid}/tokens", json={"blinded_msgs": [reqs[0].blinded]}, headers=bad)
        error_of(resp, 401, "unauthorized")
    error_of(issue(client, rid, a, reqs[:2]), 403, "issuance_limit", "1 report token")  # 2 > 1: none counted
    assert issue(client, rid, a, reqs[:1]).json()["remaining"] == 0
    error_of(issue(client, rid, a, reqs[1:2]), 403, "issuance_limit", "has 1")
    # revoked: no more tokens
    listed = client.get(f"{API}/device-credentials", headers=AUTH).json()["credentials"]
    assert all("credential" not in c and "secret_hash" not in c for c in listed)
    assert client.delete(f"{API}/device-credentials/{listed[1]['id']}", headers=AUTH).json()["revoked"]
    error_of(issue(client, rid, b, reqs[2:3]), 401, "unauthorized", "revoked")
    # a round that takes no reports gives no tokens: before its head list, and after close
    fresh = create(client)
    error_of(client.get(f"{API}/rounds/{fresh}/token-key"), 409, None, "collecting-optin")
    (c,) = credentials(client)
    assert post(client, rid, with_token(client, rid, c, msgs[3])).json()["counted"] == 1
    assert client.post(f"{API}/rounds/{rid}/close", json={"flagged": "publish"}, headers=AUTH).status_code == 200
    error_of(client.get(f"{API}/rounds/{rid}/token-key"), 409)
    (c2,) = credentials(client)
    error_of(issue(client, rid, c2, reqs[2:3]), 409)


def test_concurrent_requests_cannot_pass_the_limit(store_url: str) -> None:
    with TestClient(create_app(store_url, ADMIN)) as c:
        (cred,) = credentials(c, per_round=5)
        rid, hl = blender_round(c)
        key = key_of(c, rid)
        msgs = device_messages(hl, 16, seed=3)
        reqs = [tokens.TokenRequest.make(key) for _ in msgs]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda r: issue(c, rid, cred, [r]).status_code, reqs))
    assert sorted(statuses) == [200] * 5 + [403] * 11


def test_bad_issuance_requests_get_a_clear_4xx(client: TestClient) -> None:
    (cred,) = credentials(client, per_round=10)
    rid, _ = blender_round(client)
    auth = {"Authorization": f"Bearer {cred}"}
    n = key_of(client, rid).public_key.public_numbers().n
    url = f"{API}/rounds/{rid}/tokens"
    for body, status, needle in (
            ({"blinded_msgs": []}, 422, "blinded_msgs"),
            ({"blinded_msgs": ["AAAA"]}, 422, "256 bytes"),
            ({"blinded_msgs": ["***" * 100]}, 422, "base64"),
            ({"blinded_msgs": [tokens.b64(n.to_bytes(256, "big"))]}, 422, "modulus"),
            ({"blinded_msgs": [tokens.b64(b"\xff" * 256)]}, 422, "modulus"),
            ({"blinded_msgs": "x"}, 422, "blinded_msgs"),
            ({"blinded": ["x"]}, 422, "blinded"),
            ({"blinded_msgs": ["A" * 100_000]}, 422, "blinded_msgs")):
        msg = error_of(client.post(url, json=body, headers=auth), status, None, needle)
        assert len(msg) <= 600
    error_of(client.post(url, content=b"{", headers={**auth, "Content-Type": "application/json"}), 400)
    error_of(client.post(f"{API}/rounds/{'A' * 22}/tokens", json={"blinded_msgs": ["A"]}, headers=auth), 404)
    # nothing was counted by the refusals: the credential still has its 10
    req = tokens.TokenRequest.make(key_of(client, rid))
    assert issue(client, rid, cred, [req]).json()["remaining"] == 9
    for body in ({"count": 0}, {"count": 10_001}, {"tokens_per_round": 0}, {"count": "many"}, {"label": "a\x00b"},
                 {"other": 1}):
        error_of(client.post(f"{API}/device-credentials", json=body, headers=AUTH), 422)
    error_of(client.post(f"{API}/device-credentials", json={}), 401)
    error_of(client.get(f"{API}/device-credentials"), 401)
    error_of(client.delete(f"{API}/device-credentials/999", headers=AUTH), 404, None, "999")
    error_of(client.delete(f"{API}/device-credentials/0", headers=AUTH), 422)
    error_of(client.post(f"{API}/device-credentials/self"), 404, None, "self-enrolment is off")


def test_open_admission_takes_reports_without_tokens(store_url: str) -> None:
    with TestClient(create_app(store_url, ADMIN, open_admission=True)) as c:
        rid, hl = blender_round(c)
        assert c.get(f"{API}/rounds/{rid}/token-key").json()["admission"] == "open"
        assert post(c, rid, device_messages(hl, 1, seed=4)).json()["counted"] == 1
        error_of(c.post(f"{API}/rounds/{rid}/tokens", json={"blinded_msgs": ["A" * 342]},
                        headers={"Authorization": "Bearer x"}), 422, None, "--open-admission")


def test_self_enrolment_gives_one_token_per_round(store_url: str) -> None:
    with TestClient(create_app(store_url, ADMIN, self_enrolment=True)) as c:
        resp = c.post(f"{API}/device-credentials/self")
        assert resp.status_code == 201 and resp.json()["tokens_per_round"] == 1
        rid, hl = blender_round(c)
        msg = with_token(c, rid, resp.json()["credential"], device_messages(hl, 1, seed=5)[0])
        assert post(c, rid, msg).json()["counted"] == 1


# ----- unlinkability ------------------------------------------------------------------------------
def _dump(store_url: str) -> dict[str, list[tuple[Any, ...]]]:
    engine = sa.create_engine(store_url)
    try:
        with engine.connect() as conn:
            names = sa.inspect(conn).get_table_names()
            return {t: [tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {t}")).all()] for t in names}
    finally:
        engine.dispose()


def _implied_blinding(key: Any, priv: Any, blinded: bytes, token: bytes) -> int:
    """The blinding factor r under which ``blinded`` would be the token's blinded message: r^e = blinded / EM,
    EM = token^e mod n (the PSS-encoded token input the token signs). Exists for every pairing (RSA is a
    permutation), which is what blindness means."""
    pub = key.public_numbers()
    em = pow(int.from_bytes(token, "big"), pub.e, pub.n)
    ratio = int.from_bytes(blinded, "big") * pow(em, -1, pub.n) % pub.n
    return pow(ratio, priv.private_numbers().d, pub.n)


def test_issuance_cannot_be_linked_to_reports(client: TestClient, store_url: str) -> None:
    a, b = credentials(client, 2)
    rid, hl = blender_round(client)
    key = key_of(client, rid)
    msgs = device_messages(hl, 2, seed=6)
    reqs = [tokens.TokenRequest.make(key) for _ in msgs]
    sigs = [issue(client, rid, cred, [r]).json()["blind_sigs"][0] for cred, r in zip((a, b), reqs, strict=True)]
    sent = [tokens.spend(m, r.finalize(s)) for m, r, s in zip(msgs, reqs, sigs, strict=True)]
    assert post(client, rid, sent[::-1]).json()["counted"] == 2
    # 1. what is stored about issuance is a count per credential and round, nothing else
    dump = _dump(store_url)
    num = next(r for r in dump["rounds"] if rid in r)[0]
    assert sorted(dump["token_issuance"]) == [("credential:1", num, 1), ("credential:2", num, 1)]
    # 2. no byte of the issuance transcript or the tokens is in the database, in any encoding
    seen = [tokens.unb64(x, "x") for x in [r.blinded for r in reqs] + sigs + [m["token"] for m in sent]]
    needles = [enc for raw in seen for enc in (raw[:24], tokens.b64(raw)[:32].encode(), raw.hex()[:32].encode(),
                                               hashlib.sha256(raw).hexdigest()[:32].encode())]
    if store_url.startswith("sqlite"):
        blob = b"".join(p.read_bytes() for p in database_files(store_url))
        assert not [n for n in needles if n in blob]
    text = json.dumps(dump, default=str).encode()
    assert not [n for n in needles if n in text]
    # 3. even the whole transcript (which is not stored) fits both pairings: for issuance i and report j there is a
    # blinding factor that turns report j's token input into exactly the blinded message issuance i received
    with open_store(store_url) as store:
        _, _, private = store.round_key(rid, private=True)
    pub = key.public_key
    pss = blindrsa.TOKEN_TYPE_2_VARIANT
    for i, req in enumerate(reqs):
        for m in sent:
            r = _implied_blinding(pub, private, tokens.unb64(req.blinded, "b"), tokens.unb64(m["token"], "t"))
            em = pow(int.from_bytes(tokens.unb64(m["token"], "t"), "big"), pub.public_numbers().e,
                     pub.public_numbers().n)
            assert em * pow(r, 65537, pub.public_numbers().n) % pub.public_numbers().n == int.from_bytes(
                tokens.unb64(req.blinded, "b"), "big"), (i, m["id"])
    # the control: without blinding (r = 1) the pairing is plain to see, so the check above is not vacuous
    raw_input = tokens.token_input(rid, key.key_id, tokens.new_nonce())
    unblinded, _ = blindrsa.blind(pub, raw_input, variant=pss, r=1)
    assert _implied_blinding(pub, private, unblinded, blindrsa.blind_sign(private, unblinded)) == 1


# ----- the private key leaves the files -----------------------------------------------------------
def _files_holding(store_url: str, needle: bytes) -> int:
    """Files of the database holding ``needle``: SQLite's (main, WAL, ...), or PostgreSQL's table files."""
    if store_url.startswith("sqlite"):
        return sum(needle in p.read_bytes() for p in database_files(store_url))
    with open_store(store_url) as store:
        where = store.read(lambda conn: [
            conn.execute(sa.text("SELECT current_setting('data_directory')")).scalar_one(),
            conn.execute(sa.text("SELECT oid FROM pg_database WHERE datname = current_database()")).scalar_one()])
        store.read(lambda conn: conn.execute(sa.text("CHECKPOINT")))  # table pages reach their files
    return sum(needle in p.read_bytes() for p in (Path(where[0]) / "base" / str(where[1])).iterdir() if p.is_file())


def test_the_round_key_is_gone_from_the_database_files_after_close(client: TestClient, store_url: str) -> None:
    (cred,) = credentials(client)
    rid, hl = blender_round(client)
    msg = with_token(client, rid, cred, device_messages(hl, 1, seed=7)[0])
    stored = _dump(store_url)["round_keys"][0][2]
    needle = stored[100:160].encode()  # 60 characters of the base64 PKCS#8 private key
    assert _files_holding(store_url, needle) >= 1  # the check can see it
    assert post(client, rid, msg).json()["counted"] == 1
    assert client.post(f"{API}/rounds/{rid}/close", json={"flagged": "publish"}, headers=AUTH).status_code == 200
    assert _dump(store_url)["round_keys"][0][2] is None
    assert _files_holding(store_url, needle) == 0


# ----- the device SDK on a real server ------------------------------------------------------------
def test_devices_report_through_the_sdk_with_tokens(store_url: str, tmp_path: Path) -> None:
    from hybriddp.device.ledger import DeviceLedger
    with local_server(create_app(store_url, ADMIN)) as url:
        admin = AdminClient(url, ADMIN)
        creds = [c["credential"] for c in admin.create_credentials(3)]
        with TestClient(create_app(store_url, ADMIN)) as c:
            rid, _ = blender_round(c)
        records = [("weather", "https://w.example/a")]
        ledger = DeviceLedger(tmp_path / "ledger.json", lifetime_epsilon=20.0, lifetime_delta=1e-3)
        # report_now=True: a test, not about when devices report (tests/service/test_unlinkable.py is)
        assert DeviceClient(url, rid, ledger, credential=creds[0], report_now=True).participate(records).counted == 1
        # without a credential: refused by the server, with the way out
        with pytest.raises(ServiceRequestError, match="token"):
            DeviceClient(url, rid, DeviceClient.NO_LEDGER, report_now=True).participate(records)
        # the server fails after the token was issued: the outbox keeps message and token; the next run resends
        # both (the credential's one token was spent on it: asking again would be refused)
        outbox = tmp_path / "outbox.json"
        dev = DeviceClient(url, rid, DeviceLedger(tmp_path / "l2.json", lifetime_epsilon=20.0, lifetime_delta=1e-3),
                           outbox=outbox, credential=creds[1], report_now=True)

        def down(*_a: Any, **_k: Any) -> Any:
            raise ServiceUnavailableError("the server is down", status=503)
        dev._post_messages = down  # type: ignore[method-assign]
        with pytest.raises(ServiceUnavailableError):
            dev.participate(records)
        pending = json.loads(outbox.read_text())["message"]
        assert pending["id"] == tokens.Token.parse(pending["token"]).message_id
        again = DeviceClient(url, rid, DeviceLedger(tmp_path / "l2.json"), outbox=outbox, credential=creds[1],
                             report_now=True)
        assert again.participate(records).counted == 1 and not outbox.exists()
        # a relay with many tokens per round submits prepared messages; resubmitting is acknowledged, not counted
        (relay,) = admin.create_credentials(1, tokens_per_round=100, label="relay")
        hl = DeviceClient(url, rid, DeviceClient.NO_LEDGER).fetch_headlist()
        rc = DeviceClient(url, rid, DeviceClient.NO_LEDGER, credential=relay["credential"])
        batch = rc.with_tokens(device_messages(hl, 40, seed=8), chunk=16)
        assert rc.submit_batch(batch, chunk=25).counted == 40
        assert rc.submit_batch(batch).duplicates == 40
        # on the real server too: a token spent on another message, and no token, are refused (403)
        import httpx
        other = device_messages(hl, 1, seed=9)[0]
        for msg, code in (({**other, "token": batch[0]["token"]}, "token_invalid"), (other, "token_required")):
            resp = httpx.post(f"{url}{API}/rounds/{rid}/reports", json=msg)
            assert resp.status_code == 403 and resp.json()["error"]["code"] == code, resp.text
        assert admin.round(rid)["counts"]["messages"] == 42
        assert [c["tokens_per_round"] for c in admin.credentials()] == [1, 1, 1, 100]


def test_credentials_and_participate_commands(store_url: str, tmp_path: Path) -> None:
    from test_client import _clean_error, _cli, _csv
    with local_server(create_app(store_url, ADMIN)) as url:
        env = {"HYBRIDDP_SERVER": url, "HYBRIDDP_ADMIN_TOKEN": ADMIN}
        creds = tmp_path / "creds.txt"
        out = _cli("credentials", "create", "--count", "2", "--label", "phones", "--out", creds, env=env)
        lines = creds.read_text().split()
        assert len(lines) == 2 and all(c.startswith("hdc_") for c in lines)
        assert oct(creds.stat().st_mode & 0o777) == "0o600" and lines[0] not in out.output
        listed = json.loads(_cli("credentials", "list", "--json", env=env).output)["credentials"]
        assert [(c["id"], c["label"], c["revoked"]) for c in listed] == [(1, "phones", None), (2, "phones", None)]
        with TestClient(create_app(store_url, ADMIN)) as c:
            rid, _ = blender_round(c)
        device = _csv(tmp_path / "device.csv", [("weather", "https://w.example/a")])
        mine = tmp_path / "mine.txt"
        mine.write_text(lines[0] + "\n")
        base = ("participate", "--round", rid, "--input", device, "--json", "--report-now")  # a test: at once
        # no credential: the server refuses (one line); the charged message waits in the outbox and goes, with a
        # token, on the next run
        no = _cli(*base, "--device-ledger", tmp_path / "l.json", env=env, ok=False)
        _clean_error(no, "token")
        got = json.loads(_cli(*base, "--device-ledger", tmp_path / "l.json", "--credential-file", mine, env=env).stdout)
        assert got["counted"] == 1
        _clean_error(_cli(*base, "--no-device-ledger", "--credential-file", tmp_path / "missing", env=env, ok=False),
                     "--credential-file", "no such file")
        _cli("credentials", "revoke", "2", env=env)
        (tmp_path / "theirs.txt").write_text(lines[1] + "\n")
        _clean_error(_cli(*base, "--no-device-ledger", "--credential-file", tmp_path / "theirs.txt", env=env,
                          ok=False), "revoked")
        _clean_error(_cli("credentials", "revoke", "9", env=env, ok=False), "no device credential 9")
        _clean_error(_cli("credentials", "create", "--count", "0", env=env, ok=False), "--count")
        assert AdminClient(url, ADMIN).round(rid)["counts"]["messages"] == 1
