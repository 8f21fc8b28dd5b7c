"""What the JavaScript report-token client (clients/js/hybriddp-device.js) is compared with, protocol v2: fixtures
written by :mod:`hybriddp.core.tokens` (spec-v2 §2, docs/TOKENS.md).

:func:`token_fixtures` is the ``"tokens"`` part of the file ``HYBRIDDP_JS_FIXTURES`` names (tests/test_js_device.py
and tests/test_js_tokens.py write it; clients/js/test/tokens.test.js reads it):

* ``nonces``: random nonces with Python's token input and derived message id;
* ``challenges``: TokenChallenge bytes of several round ids;
* ``keys``: token-key documents and the head list's commitment (``token_key``) with ``RoundKey.from_dict``'s verdict
  (accepted, or refused: another key committed, e = 3, 1024 or 3072 bits, a commitment naming other sizes, none);
* ``blinds``: from a given nonce, the blinding of RFC 9474 §4.2 replayed from given random bytes (the salt, then r,
  some candidates of r rejected first), with Python's blinded message, the server's blind signature, the Token it
  finalizes to (which :class:`tokens.TokenVerifier` accepts) and the message ``tokens.spend`` makes of it;
* ``rfc9578``: the token type 2 vectors of RFC 9578 Appendix A.2 (tests/blindrsa_vectors.json), replayed the same
  way, with a commitment to the RFC's key.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from hybriddp.core import blindrsa, tokens
from hybriddp.core.errors import DataError
from tokenhelpers import stream

ROUND = "rnd-2f1c0a9b4e7d"
VECTORS = json.loads((Path(__file__).with_name("blindrsa_vectors.json")).read_text(encoding="utf-8"))


def _key_doc(spki: bytes, round_id: str = ROUND, **changes: Any) -> dict[str, Any]:
    doc = {**tokens.RoundKey(round_id, spki).to_dict(), "admission": "tokens"}
    return {**doc, **changes}


def _committed(spki: bytes) -> dict[str, Any]:
    """The head list's ``token_key`` for a key (what the service publishes)."""
    key = serialization.load_der_public_key(spki)
    assert isinstance(key, rsa.RSAPublicKey)
    nums = key.public_numbers()
    return {"key_id": tokens.b64(hashlib.sha256(spki).digest()), "modulus_bits": nums.n.bit_length(), "e": nums.e}


def _keys(key: rsa.RSAPrivateKey, other: rsa.RSAPrivateKey) -> list[dict[str, Any]]:
    spki = blindrsa.public_key_spki(key.public_key())
    com = _committed(spki)
    b64 = tokens.b64
    rsa_encryption = key.public_key().public_bytes(serialization.Encoding.DER,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    ec_spki = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    small = blindrsa.public_key_spki(rsa.generate_private_key(65537, 1024).public_key())
    large = blindrsa.public_key_spki(rsa.generate_private_key(65537, 3072).public_key())
    e3 = blindrsa.public_key_spki(rsa.generate_private_key(3, 2048).public_key())
    other_spki = blindrsa.public_key_spki(other.public_key())
    cases: list[tuple[str, Any, Any]] = [
        ("the server's document", _key_doc(spki), com),
        ("key id with base64 padding", _key_doc(spki, key_id=b64(hashlib.sha256(spki).digest()) + "="), com),
        ("rsaEncryption OID (Python's reader takes it too)", _key_doc(rsa_encryption), _committed(rsa_encryption)),
        ("another key than the committed one", _key_doc(other_spki), com),
        ("no commitment", _key_doc(spki), None),
        ("commitment not an object", _key_doc(spki), "x"),
        ("committed e = 3", _key_doc(spki), {**com, "e": 3}),
        ("committed 3072 bits", _key_doc(spki), {**com, "modulus_bits": 3072}),
        ("committed 1024 bits", _key_doc(spki), {**com, "modulus_bits": 1024}),
        ("committed key id of 31 bytes", _key_doc(spki), {**com, "key_id": b64(hashlib.sha256(spki).digest()[:31])}),
        ("e = 3, committed", _key_doc(e3), _committed(e3)),
        ("1024 bits, committed", _key_doc(small), _committed(small)),
        ("3072 bits, committed", _key_doc(large), _committed(large)),
        ("another round", _key_doc(spki, round_id="rnd-other"), com),
        ("token type 1", _key_doc(spki, token_type=1), com),
        ("another key's id", _key_doc(spki, key_id=b64(blindrsa.token_key_id(other.public_key()))), com),
        ("key id missing", {k: v for k, v in _key_doc(spki).items() if k != "key_id"}, com),
        ("public key not base64", _key_doc(spki, public_key="***"), com),
        ("public key garbage", _key_doc(b"hello, not DER", key_id=b64(hashlib.sha256(b"hello, not DER").digest())),
         com),
        ("a trailing byte", _key_doc(spki + b"\x00", key_id=b64(hashlib.sha256(spki + b"\x00").digest())), com),
        ("an EC key", _key_doc(ec_spki), com),
        ("a list", [_key_doc(spki)], com),
        ("null", None, com),
    ]
    out = []
    for name, doc, committed in cases:
        try:
            tokens.RoundKey.from_dict(doc, ROUND, committed if committed is not None else {})
            if committed is None:  # the device refuses a head list without a commitment
                tokens.check_committed_key(tokens.RoundKey.from_dict(doc, ROUND), None)
        except DataError as exc:
            verdict: str | None = str(exc)
        else:
            verdict = None
        out.append({"name": name, "doc": doc, "committed": committed, "error": verdict})
    assert [c["error"] is None for c in out[:5]] == [True, True, True, False, False], out[:5]
    return out


def _nonces(rng: random.Random, key: tokens.RoundKey) -> list[dict[str, Any]]:
    fixed = [bytes(32), b"\xff" * 32, bytes(range(32))]
    return [{"nonce": n.hex(), "token_input": tokens.token_input(ROUND, key.key_id, n).hex(),
             "message_id": tokens.message_id_for(n)} for n in fixed + [rng.randbytes(32) for _ in range(25)]]


def _blinds(key: rsa.RSAPrivateKey, rk: tokens.RoundKey, rng: random.Random) -> list[dict[str, Any]]:
    """From a given nonce: blind, sign and finalize replayed from given bytes; the first cases reject r first."""
    n = key.public_key().public_numbers().n
    verifier = tokens.TokenVerifier(rk)
    out = []
    for i in range(10):
        nonce = rng.randbytes(32)
        rejected = [b"\xff" * 256, b"\x00" * 256, n.to_bytes(256, "big")][: max(0, 3 - i)]  # ≥ n, 0, n: redrawn
        data = rng.randbytes(48) + b"".join(rejected) + rng.randrange(1, n).to_bytes(256, "big")
        msg_input = tokens.token_input(ROUND, rk.key_id, nonce)
        blinded, inv = blindrsa.blind(key.public_key(), msg_input, stream(data), variant=tokens.VARIANT)
        blind_sig = blindrsa.blind_sign(key, blinded)
        auth = blindrsa.finalize(key.public_key(), msg_input, blind_sig, inv, variant=tokens.VARIANT)
        token = tokens.b64(msg_input + auth)
        message = {"id": "AAAAAAAAAAAAAAAAAAAAAA", "headlist": "sha256:" + "ab" * 32,
                   "reports": [{"query": "pâte à crêpes 😀", "url": None}]}
        spent = tokens.spend(message, token)
        verifier.check(spent, spent["id"], "fixture")
        out.append({"nonce": nonce.hex(), "random": data.hex(), "blinded": tokens.b64(blinded),
                    "blind_sig": tokens.b64(blind_sig), "token": token, "message_id": tokens.message_id_for(nonce),
                    "message": message, "spent": spent})
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
    return {"key_doc": _key_doc(pks, round_id="rfc9578"), "headlist": {"token_key": _committed(pks)}, "vectors": out}


def token_fixtures(seed: int = 9578) -> dict[str, Any]:
    """Everything tokens.test.js compares with (a fresh 2048-bit key per call; the rest seeded)."""
    rng = random.Random(seed)
    key, other = tokens.new_private_key(), tokens.new_private_key()
    rk = tokens.round_key(ROUND, key)
    round_ids = [ROUND, "", "0", "01HZX3K9Q7R2M5N8P4T6V1W0YA", "a" * 300, "round with spaces/and?query"]
    return {"round": ROUND, "key_doc": _key_doc(rk.spki), "headlist": {"token_key": rk.committed()},
            "nonces": _nonces(rng, rk), "challenges": [{"round": r, "challenge": tokens.challenge(r).hex()}
                                                       for r in round_ids],
            "keys": _keys(key, other), "blinds": _blinds(key, rk, rng), "rfc9578": _rfc9578()}
