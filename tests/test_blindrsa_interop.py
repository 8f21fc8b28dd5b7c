"""hybriddp's RSA blind signatures (:mod:`hybriddp.core.blindrsa`) against a library no one here wrote,
`@cloudflare/blindrsa-ts` (npm, pinned in tests/interop/package.json), under node: tokens issued by the Python
signer are finalized by the TS client, and messages blinded by the Python client are signed by the TS signer, for
every RFC 9474 variant; each side verifies the other's signatures, and a tampered one fails on both. hybriddp's JS
device (clients/js/hybriddp-device.js) gets a report token signed by the TS signer, which the TS library and the
Python server verify.

The package is installed by `.ci/run` (`npm ci --prefix tests/interop`); in CI a missing package or node is a
failure. Elsewhere the tests say how to install it and skip."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from hybriddp.core import blindrsa, tokens
from hybriddp.core.blindrsa import Variant
from hybriddp.core.protocol import new_message_id
from interophelpers import INTEROP, node_with

SCRIPT = INTEROP / "blindrsa.mjs"


@pytest.fixture(scope="module")
def node() -> str:
    return node_with("@cloudflare/blindrsa-ts")


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _ts(node: str, step: str, variant: Variant, *args: bytes) -> dict[str, Any]:
    out = subprocess.run([node, str(SCRIPT), step, variant.rfc_name, *(a.hex() for a in args)], cwd=INTEROP,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _spki(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _pkcs8(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.mark.parametrize("variant", list(Variant), ids=lambda v: v.rfc_name)
def test_python_signer_and_ts_client(node: str, key: rsa.RSAPrivateKey, variant: Variant) -> None:
    msg = b"\x00\x02" + os.urandom(32) + b"hybriddp interop: a token input"
    client = _ts(node, "blind", variant, _spki(key), msg)
    prepared, blinded, inv = (bytes.fromhex(client[k]) for k in ("prepared", "blinded", "inv"))
    assert prepared[-len(msg):] == msg and len(prepared) == len(msg) + (32 if variant.randomized else 0)
    blind_sig = blindrsa.blind_sign(key, blinded)  # the Python server signs what the TS client blinded
    sig = bytes.fromhex(_ts(node, "finalize", variant, _spki(key), prepared, blind_sig, inv)["sig"])
    assert blindrsa.verify(key.public_key(), prepared, sig, variant=variant)
    assert _ts(node, "verify", variant, _spki(key), prepared, sig)["valid"] is True
    bad = bytes([sig[0] ^ 1]) + sig[1:]
    assert not blindrsa.verify(key.public_key(), prepared, bad, variant=variant)
    assert _ts(node, "verify", variant, _spki(key), prepared, bad)["valid"] is False


@pytest.mark.parametrize("variant", list(Variant), ids=lambda v: v.rfc_name)
def test_ts_signer_and_python_client(node: str, key: rsa.RSAPrivateKey, variant: Variant) -> None:
    prepared = blindrsa.prepare(b"hybriddp interop: the other way", variant.randomized)
    blinded, inv = blindrsa.blind(key.public_key(), prepared, variant=variant)
    blind_sig = bytes.fromhex(_ts(node, "sign", variant, _pkcs8(key), blinded)["blind_sig"])
    sig = blindrsa.finalize(key.public_key(), prepared, blind_sig, inv, variant=variant)
    assert _ts(node, "verify", variant, _spki(key), prepared, sig)["valid"] is True
    assert blindrsa.verify(key.public_key(), prepared, sig, variant=variant)
    assert _ts(node, "verify", variant, _spki(key), prepared + b"x", sig)["valid"] is False


def test_js_device_client_and_ts_signer(node: str, key: rsa.RSAPrivateKey) -> None:
    """hybriddp's JS device (clients/js) blinds a report token, the TS library signs it blind, the JS device
    finalizes it, and both the TS library and the Python server verify the token."""
    round_key = tokens.round_key("rnd-interop", key)
    message = {"id": new_message_id(), "headlist": "sha256:" + "cd" * 32,
               "reports": [{"query": "pâte à crêpes 😀", "url": "https://例え.jp/パス"}, {"query": None, "url": None}]}
    job = {"key_doc": round_key.to_dict(), "headlist": {"token_key": round_key.committed()}, "round": "rnd-interop",
           "pkcs8": _pkcs8(key).hex(), "spki": _spki(key).hex()}
    out = subprocess.run([node, str(INTEROP / "device-tokens.mjs")], cwd=INTEROP, input=json.dumps(job),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    tok = tokens.Token.parse(res["token"])
    assert bytes.fromhex(res["token_input"]) == tok.signed_input == tokens.token_input("rnd-interop",
                                                                                       round_key.key_id, tok.nonce)
    assert res["message_id"] == tokens.message_id_for(tok.nonce)
    assert res["ts_valid"] is True and res["ts_valid_tampered"] is False
    spent = tokens.spend(message, res["token"])
    tokens.TokenVerifier(round_key).check(spent, spent["id"], "interop")
    assert res["tampered_error"] is not None and res["tampered_error"].startswith("DeviceError: ")
    assert "does not verify" in res["tampered_error"]
