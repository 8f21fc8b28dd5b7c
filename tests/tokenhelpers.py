"""What the JavaScript report-token client (clients/js/hybriddp-device.js) is compared with: fixtures written by
:mod:`hybriddp.core.tokens` (docs/TOKENS.md).

:func:`token_fixtures` is the ``"tokens"`` part of the file ``HYBRIDDP_JS_FIXTURES`` names (tests/test_js_device.py
and tests/test_js_tokens.py write it; clients/js/test/tokens.test.js reads it):

* ``payloads``: messages (non-ASCII queries, astral characters, null queries and URLs, mean values such as -0.0,
  1e-7, 5e-324 and the largest double) with Python's payload and token input, or ``error`` where Python refuses
  the message (a lone surrogate, a URL that is a number, a message id that is not ASCII). The token input is
  that of the message as posted (:func:`as_posted`: JSON.stringify writes -0.0 as 0, and the server reads 0.0);
* ``challenges``: TokenChallenge bytes of several round ids;
* ``keys``: token-key documents with ``RoundKey.from_dict``'s verdict (accepted, or refused);
* ``blinds``: the blinding of RFC 9474 §4.2 replayed from given random bytes (the salt, then r, some candidates
  of r rejected first), with Python's blinded message, the server's blind signature and the token it finalizes
  to: identical bytes give the identical blinded message and token;
* ``rfc9578``: the token type 2 vectors of RFC 9578 Appendix A.2 (tests/blindrsa_vectors.json), replayed the
  same way.

:func:`relay_credential` and :func:`tokened` get real tokens from a running service for the tests of the service
and of the pages (any client with ``get``/``post``: a Starlette ``TestClient`` or an ``httpx.Client``).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from hybriddp.core import blindrsa, tokens
from hybriddp.core.errors import DataError
from hybriddp.core.protocol import new_message_id

ROUND = "rnd-2f1c0a9b4e7d"
VECTORS = json.loads((Path(__file__).with_name("blindrsa_vectors.json")).read_text(encoding="utf-8"))

QUERIES = ["weather", "pâte à crêpes", "日本語 検索", "emoji 😀🚀", "\U0001f600 first", "", "nul\x00byte", "ls\u2028ps",
           "\uffff", "e\u0301", 'say "hi"', "x" * 70_000]
URLS = ["https://example.com/", "https://münchen.de/straße?q=ä&x=1", "https://例え.jp/パス", "https://e.com/😀", None]
MEAN_VALUES: list[float | int] = [0.0, -0.0, 1e-7, -1e-7, 123.456, -98765.4321, 1e308, 1.7976931348623157e308,
                                  5e-324, 2.2250738585072014e-308, 3, -7, 2**53 + 1, 0.1, 1 / 3]


def stream(data: bytes) -> Callable[[int], bytes]:
    """An rng that hands out ``data`` in order (as the JS test's injected getRandomValues does)."""
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        assert pos + n <= len(data), "the replayed random bytes are used up"
        pos += n
        return data[pos - n:pos]

    return take


def _messages(rng: random.Random) -> list[dict[str, Any]]:
    """BLENDER messages (0 to 6 reports of the names above) and mean messages."""
    out: list[dict[str, Any]] = [{"id": new_message_id(), "headlist": "sha256:" + "0" * 64, "reports": []}]
    for i in range(12):
        reports = [{"query": rng.choice([*QUERIES, None]), "url": rng.choice(URLS)} for _ in range(rng.randint(1, 6))]
        if i == 0:
            reports = [{"query": q, "url": URLS[j % len(URLS)]} for j, q in enumerate(QUERIES)]
        out.append({"id": new_message_id(), "headlist": "sha256:" + "ab" * 32, "reports": reports})
    out += [{"id": new_message_id(), "round": ROUND, "value": v} for v in MEAN_VALUES]
    return out


# messages Python refuses to derive a token for (the JS client must refuse them too)
BAD_MESSAGES: list[dict[str, Any]] = [
    {"id": "AAAAAAAAAAAAAAAAAAAAAA", "reports": [{"query": "bad\ud800", "url": None}]},
    {"id": "AAAAAAAAAAAAAAAAAAAAAA", "reports": [{"query": "ok", "url": "\udc00x"}]},
    {"id": "AAAAAAAAAAAAAAAAAAAAAA", "reports": [{"query": "ok", "url": 5}]},
    {"id": "AAAAAAAAAAAAAAAAAAAAAA", "reports": [{"query": ["nested"], "url": None}]},
    {"id": "AAAAAAAAAAAAAAAAAAAAAä", "reports": []},
    {"id": "AAAAAAAAAAAAAAAAAAAAAä", "value": 1.5},
]


def as_posted(msg: dict[str, Any]) -> dict[str, Any]:
    """The message as the server reads it from a JS device: JSON.stringify writes a value of -0.0 as 0."""
    return {**msg, "value": 0.0} if "value" in msg and msg["value"] == 0 else msg


def _payloads(key: tokens.RoundKey, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``payload``: of the message; ``posted_payload`` and ``token_input``: of the message as posted."""
    out = []
    for msg in messages:
        posted = tokens.message_payload(as_posted(msg))
        out.append({"message": msg, "payload": tokens.message_payload(msg).hex(), "posted_payload": posted.hex(),
                    "token_input": tokens.token_input(ROUND, key.key_id, msg["id"], posted).hex()})
    for msg in BAD_MESSAGES:
        try:
            tokens.token_input(ROUND, key.key_id, msg["id"], tokens.message_payload(msg))
        except (UnicodeEncodeError, AttributeError, TypeError):
            out.append({"message": msg, "error": True})
        else:
            raise AssertionError(f"Python accepts {msg!r}")
    return out


def _key_doc(spki: bytes, round_id: str = ROUND, **changes: Any) -> dict[str, Any]:
    doc = {**tokens.RoundKey(round_id, spki).to_dict(), "admission": "tokens"}
    return {**doc, **changes}


def _keys(key: rsa.RSAPrivateKey, other: rsa.RSAPrivateKey) -> list[dict[str, Any]]:
    spki = blindrsa.public_key_spki(key.public_key())
    b64 = tokens.b64
    rsa_encryption = key.public_key().public_bytes(serialization.Encoding.DER,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    ec_spki = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    small = blindrsa.public_key_spki(rsa.generate_private_key(65537, 1024).public_key())
    large = blindrsa.public_key_spki(rsa.generate_private_key(65537, 3072).public_key())
    e3 = blindrsa.public_key_spki(rsa.generate_private_key(3, 2048).public_key())
    cases: list[tuple[str, Any]] = [
        ("the server's document", _key_doc(spki)),
        ("key id with base64 padding", _key_doc(spki, key_id=b64(hashlib.sha256(spki).digest()) + "=")),
        ("rsaEncryption OID (Python's reader takes it too)", _key_doc(rsa_encryption)),
        ("e = 3", _key_doc(e3)),
        ("another round", _key_doc(spki, round_id="rnd-other")),
        ("round missing", {k: v for k, v in _key_doc(spki).items() if k != "round"}),
        ("token type 1", _key_doc(spki, token_type=1)),
        ("token type '2'", _key_doc(spki, token_type="2")),
        ("another key's id", _key_doc(spki, key_id=b64(blindrsa.token_key_id(other.public_key())))),
        ("key id of 31 bytes", _key_doc(spki, key_id=b64(hashlib.sha256(spki).digest()[:31]))),
        ("key id missing", {k: v for k, v in _key_doc(spki).items() if k != "key_id"}),
        ("key id not base64", _key_doc(spki, key_id="not base64!")),
        ("public key not base64", _key_doc(spki, public_key="***")),
        ("public key missing", {k: v for k, v in _key_doc(spki).items() if k != "public_key"}),
        ("public key a number", _key_doc(spki, public_key=12)),
        ("public key garbage", _key_doc(b"hello, not DER", key_id=b64(hashlib.sha256(b"hello, not DER").digest()))),
        ("a trailing byte", _key_doc(spki + b"\x00", key_id=b64(hashlib.sha256(spki + b"\x00").digest()))),
        ("truncated", _key_doc(spki[:-1], key_id=b64(hashlib.sha256(spki[:-1]).digest()))),
        ("an EC key", _key_doc(ec_spki)),
        ("1024 bits", _key_doc(small)),
        ("3072 bits", _key_doc(large)),
        ("a list", [_key_doc(spki)]),
        ("null", None),
    ]
    out = []
    for name, doc in cases:
        try:
            tokens.RoundKey.from_dict(doc, ROUND)
        except DataError as exc:
            verdict: str | None = str(exc)
        else:
            verdict = None
        out.append({"name": name, "doc": doc, "error": verdict})
    assert [c["error"] is None for c in out[:5]] == [True, True, True, True, False]
    return out


def _blinds(key: rsa.RSAPrivateKey, rk: tokens.RoundKey, messages: list[dict[str, Any]],
            rng: random.Random) -> list[dict[str, Any]]:
    """Blind, sign and finalize replayed from given bytes; the first cases reject candidates of r first."""
    n = key.public_key().public_numbers().n
    verifier = tokens.TokenVerifier(rk)
    out = []
    for i, msg in enumerate(messages[:8] + messages[-4:]):
        rejected = [b"\xff" * 256, b"\x00" * 256, n.to_bytes(256, "big")][: max(0, 3 - i)]  # ≥ n, 0, n: redrawn
        data = rng.randbytes(48) + b"".join(rejected) + rng.randrange(1, n).to_bytes(256, "big")
        payload = tokens.message_payload(as_posted(msg))
        msg_input = tokens.token_input(ROUND, rk.key_id, msg["id"], payload)
        blinded, inv = blindrsa.blind(key.public_key(), msg_input, stream(data), variant=tokens.VARIANT)
        blind_sig = blindrsa.blind_sign(key, blinded)
        token = blindrsa.finalize(key.public_key(), msg_input, blind_sig, inv, variant=tokens.VARIANT)
        verifier.check({**msg, "token": tokens.b64(token)}, msg["id"], payload, "fixture")
        out.append({"message": msg, "random": data.hex(), "blinded": tokens.b64(blinded),
                    "blind_sig": tokens.b64(blind_sig), "token": tokens.b64(token)})
    return out


def _rfc9578() -> dict[str, Any]:
    """RFC 9578 A.2: the key, and per vector the token input, the replayed salt and r, and the expected bytes."""
    v = VECTORS["rfc9578_type2"]
    pks = bytes.fromhex(v["pkS"])
    out = []
    for vec in v["vectors"]:
        token, request = bytes.fromhex(vec["token"]), bytes.fromhex(vec["token_request"])
        assert len(vec["salt"]) == 2 * 48 and len(vec["blind"]) == 2 * 256  # r as 256 bytes: read back as is
        out.append({"token_input": token[:98].hex(), "random": vec["salt"] + vec["blind"],
                    "blinded": request[3:].hex(), "blind_sig": vec["token_response"], "token": token[98:].hex()})
    return {"key_doc": _key_doc(pks, round_id="rfc9578"), "vectors": out}


def token_fixtures(seed: int = 9578) -> dict[str, Any]:
    """Everything tokens.test.js compares with (a fresh 2048-bit key per call; the rest seeded)."""
    rng = random.Random(seed)
    key, other = tokens.new_private_key(), tokens.new_private_key()
    rk = tokens.round_key(ROUND, key)
    messages = _messages(rng)
    round_ids = [ROUND, "", "0", "01HZX3K9Q7R2M5N8P4T6V1W0YA", "a" * 300, "round with spaces/and?query"]
    return {"round": ROUND, "key_doc": _key_doc(rk.spki), "payloads": _payloads(rk, messages),
            "challenges": [{"round": r, "challenge": tokens.challenge(r).hex()} for r in round_ids],
            "keys": _keys(key, other), "blinds": _blinds(key, rk, messages, rng), "rfc9578": _rfc9578()}


# ----- tokens from a running service ---------------------------------------------------------------
def relay_credential(http: Any, api: str, admin: dict[str, str], tokens_per_round: int) -> str:
    """A new device credential with ``tokens_per_round`` tokens a round (a relay's), made by the administrator."""
    r = http.post(f"{api}/device-credentials", headers=admin,
                  json={"tokens_per_round": tokens_per_round, "label": "tests: relay"})
    assert r.status_code == 201, r.text
    return str(r.json()["credentials"][0]["credential"])


def tokened(http: Any, api: str, rid: str, credential: str, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages, each with a report token got with ``credential`` through the API and the id its nonce derives
    (protocol v2, docs/TOKENS.md; the key is checked against the head list's commitment)."""
    r = http.get(f"{api}/rounds/{rid}/token-key")
    assert r.status_code == 200, r.text
    committed = http.get(f"{api}/rounds/{rid}/headlist").json().get("token_key")
    key = tokens.RoundKey.from_dict(r.json(), rid, committed)
    reqs = [tokens.TokenRequest.make(key) for _ in msgs]
    r = http.post(f"{api}/rounds/{rid}/tokens", headers={"Authorization": f"Bearer {credential}"},
                  json={"blinded_msgs": [q.blinded for q in reqs]})
    assert r.status_code == 200, r.text
    return [tokens.spend(m, q.finalize(sig)) for m, q, sig in zip(msgs, reqs, r.json()["blind_sigs"], strict=True)]
