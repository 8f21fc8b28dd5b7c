"""The JavaScript device's report tokens (clients/js/hybriddp-device.js) against :mod:`hybriddp.core.tokens`, protocol
v2 (spec-v2 §2, docs/TOKENS.md).

* Fixtures written by Python (tests/jstokenhelpers.py), checked by clients/js/test/tokens.test.js under
  ``node --test``: the same token-input bytes and message ids from the same nonces, Python's verdict on token keys
  and the head list's commitment, and from the same nonce and random bytes the same blinded message and Token
  (RFC 9578's vectors included).
* Round trips with the JS client's own randomness: tests/js/tokens-driver.mjs runs ``fetchToken`` (before any
  message exists) and ``attachToken``, and this file answers its HTTP requests as the server does
  (``RoundKey.to_dict``, ``tokens.issue``); the message it makes passes :class:`TokenVerifier` with the id derived
  from its nonce, and no other id; a key other than the committed one, e = 3 and a 1024-bit key are refused before
  anything is posted; a tampered or refused issuance is a ``DeviceError`` carrying the server's message.

``node`` missing is a failure, not a skip: CI must run these tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from hybriddp.core import tokens
from hybriddp.core.protocol import new_message_id
from jstokenhelpers import token_fixtures

ROOT = Path(__file__).resolve().parents[1]
JS_DIR = ROOT / "clients" / "js"
DRIVER = Path(__file__).with_name("js") / "tokens-driver.mjs"
BASE = "https://dp.example"
ROUND = "rnd-js-tokens"
CREDENTIAL = "device-credential-0123456789abcdef"


@pytest.fixture(scope="module")
def node() -> str:
    exe = shutil.which("node")
    assert exe is not None, ("`node` is not on PATH: the JavaScript device's report tokens (clients/js) cannot be "
                             "tested. Install Node.js 20 or newer (e.g. `apt-get install nodejs`).")
    return exe


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return tokens.new_private_key()


class Server:
    """The two token endpoints, answered as docs/TOKENS.md says; ``refuse`` = (status, code) refuses issuance."""

    def __init__(self, key: rsa.RSAPrivateKey, *, key_round: str = ROUND, tamper: bool = False,
                 refuse: tuple[int, str] | None = None) -> None:
        self.key = key
        self.round_key = tokens.round_key(key_round, key)
        self.headlist = {"format": "hybriddp-headlist", "token_key": self.round_key.committed()}
        self.tamper = tamper
        self.refuse = refuse
        self.requests: list[dict[str, Any]] = []
        self.blinded: list[str] = []

    def answer(self, req: dict[str, Any]) -> tuple[int, Any]:
        self.requests.append(req)
        api = f"{BASE}/api/v1/rounds/{ROUND}"
        if req["url"] == f"{api}/token-key" and req["method"] == "GET":
            return 200, {**self.round_key.to_dict(), "admission": "tokens"}
        if req["url"] == f"{api}/tokens" and req["method"] == "POST":
            if req["headers"].get("Authorization") != f"Bearer {CREDENTIAL}":
                return 401, {"error": {"code": "unauthorized", "message": "unknown device credential"}}
            if self.refuse is not None:
                status, code = self.refuse
                return status, {"error": {"code": code, "message": f"refused for the test ({code})"}}
            assert req["headers"]["Content-Type"] == "application/json"
            body = json.loads(req["body"])
            assert list(body) == ["blinded_msgs"] and len(body["blinded_msgs"]) == 1, body
            self.blinded += body["blinded_msgs"]
            sigs = [tokens.issue(self.key, b) for b in body["blinded_msgs"]]
            if self.tamper:
                raw = bytearray(tokens.unb64(sigs[0], "blind_sig"))
                raw[100] ^= 4
                sigs[0] = tokens.b64(bytes(raw))
            return 200, {"blind_sigs": sigs, "key_id": tokens.b64(self.round_key.key_id), "remaining": 0}
        return 404, {"error": {"code": "not_found", "message": f"no route {req['method']} {req['url']}"}}


def run_device(node: str, server: Server, message: dict[str, Any], credential: str = CREDENTIAL,
               headlist: dict[str, Any] | None = None) -> dict[str, Any]:
    """fetchToken (with ``server``'s head list, or ``headlist``) then attachToken(message) in node, its requests
    answered by ``server``; its last line ({"result"} or {"error"})."""
    proc = subprocess.Popen([node, str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, encoding="utf-8")
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        job = {"base_url": BASE, "round": ROUND, "credential": credential, "message": message,
               "headlist": server.headlist if headlist is None else headlist}
        proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.flush()
        while True:
            line = proc.stdout.readline()
            assert line, f"the driver stopped (exit {proc.wait()}):\n{proc.stderr.read()[-3000:]}"
            out = json.loads(line)
            if "request" not in out:
                return out
            status, body = server.answer(out["request"])
            proc.stdin.write(json.dumps({"status": status, "body": body}) + "\n")
            proc.stdin.flush()
    finally:
        watchdog.cancel()
        proc.stdin.close()
        proc.wait(timeout=30)


def blender_message() -> dict[str, Any]:
    return {"id": new_message_id(), "headlist": "sha256:" + "ab" * 32,
            "reports": [{"query": "pâte à crêpes 😀", "url": "https://münchen.de/straße"},
                        {"query": "日本語", "url": None}, {"query": None, "url": None}]}


def verify(server: Server, msg: dict[str, Any]) -> None:
    tokens.TokenVerifier(server.round_key).check(msg, msg["id"], "test")


def test_js_token_fixtures(node: str, tmp_path: Path) -> None:
    fixtures = tmp_path / "js-token-fixtures.json"
    fixtures.write_text(json.dumps({"tokens": token_fixtures()}, ensure_ascii=True), encoding="ascii")
    env = {**os.environ, "HYBRIDDP_JS_FIXTURES": str(fixtures)}
    proc = subprocess.run([node, "--test", "test/tokens.test.js"], cwd=JS_DIR, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"node --test failed (exit {proc.returncode}):\n{output}"
    assert "# fail 0" in output and "# skipped 0" in output and "# pass 0" not in output, output


@pytest.mark.parametrize("message", [
    pytest.param(blender_message, id="blender"),
    pytest.param(lambda: {"id": new_message_id(), "headlist": "sha256:00", "reports": []}, id="no reports"),
    pytest.param(lambda: {"round": ROUND, "value": -0.0}, id="mean -0.0, no id yet"),
    pytest.param(lambda: {"id": new_message_id(), "round": ROUND, "value": 1.5e300}, id="mean large"),
])
def test_token_from_the_js_device_verifies(node: str, key: rsa.RSAPrivateKey, message: Any) -> None:
    server = Server(key)
    msg = message()
    out = run_device(node, server, msg)
    assert "result" in out, out
    result = out["result"]
    tok = tokens.Token.parse(result["token"])
    assert len(tokens.unb64(result["token"], "token")) == tokens.TOKEN_BYTES == 354
    assert result["messageId"] == tok.message_id == tokens.message_id_for(tok.nonce)
    spent = result["spent"]
    assert spent == tokens.spend(msg, result["token"])  # JS's attachToken is Python's spend
    assert {k: v for k, v in spent.items() if k not in ("id", "token")} == \
        {k: v for k, v in msg.items() if k not in ("id", "token")}
    verify(server, spent)
    assert [r["method"] for r in server.requests] == ["GET", "POST"]
    assert len(tokens.unb64(server.blinded[0], "blinded", 256)) == 256


def test_token_is_spent_by_the_id_its_nonce_gives(node: str, key: rsa.RSAPrivateKey) -> None:
    server = Server(key)
    msg = run_device(node, server, blender_message())["result"]["spent"]
    verify(server, msg)
    verify(server, {**msg, "reports": msg["reports"][:2]})  # the token is not bound to the content: the id counts
    with pytest.raises(tokens.TokenError, match="not the one derived from its token's nonce"):
        verify(server, {**msg, "id": new_message_id()})
    with pytest.raises(tokens.TokenError, match="another round"):  # another round's key
        tokens.TokenVerifier(tokens.round_key("rnd-other", key)).check(msg, msg["id"], "t")


def test_each_token_has_its_own_nonce(node: str, key: rsa.RSAPrivateKey) -> None:
    server = Server(key)
    msg = blender_message()
    first, second = (run_device(node, server, msg)["result"] for _ in range(2))
    assert server.blinded[0] != server.blinded[1]
    assert first["messageId"] != second["messageId"]
    assert tokens.Token.parse(first["token"]).nonce != tokens.Token.parse(second["token"]).nonce
    verify(server, first["spent"])
    verify(server, second["spent"])


def test_tampered_blind_signature_is_refused(node: str, key: rsa.RSAPrivateKey) -> None:
    out = run_device(node, Server(key, tamper=True), blender_message())
    assert out["error"]["name"] == "DeviceError"
    assert "not a valid blind signature" in out["error"]["message"]


@pytest.mark.parametrize(("refuse", "credential", "expected"), [
    ((403, "issuance_limit"), CREDENTIAL, "HTTP 403 issuance_limit): refused for the test (issuance_limit)"),
    ((409, "conflict"), CREDENTIAL, "HTTP 409 conflict): refused for the test (conflict)"),
    (None, "wrong-credential", "HTTP 401 unauthorized): unknown device credential"),
])
def test_refusal_carries_the_servers_message(node: str, key: rsa.RSAPrivateKey, refuse: Any, credential: str,
                                             expected: str) -> None:
    out = run_device(node, Server(key, refuse=refuse), blender_message(), credential=credential)
    assert out["error"]["name"] == "DeviceError", out
    assert expected in out["error"]["message"]
    assert out["error"]["status"] == (refuse or (401,))[0]
    assert out["error"]["code"] == (refuse[1] if refuse else "unauthorized")


def test_key_of_another_round_is_refused(node: str, key: rsa.RSAPrivateKey) -> None:
    server = Server(key, key_round="rnd-other")
    out = run_device(node, server, blender_message())
    assert out["error"]["name"] == "DeviceError"
    assert "token key: made for token type 2 and round 'rnd-other'" in out["error"]["message"]
    assert [r["method"] for r in server.requests] == ["GET"], "nothing is sent for a key of another round"


def _committed(private: rsa.RSAPrivateKey) -> dict[str, Any]:
    return {"format": "hybriddp-headlist", "token_key": tokens.round_key(ROUND, private).committed()}


@pytest.mark.parametrize(("headlist", "expected"), [
    pytest.param(lambda key: {"format": "hybriddp-headlist"}, "published before round keys were committed",
                 id="no commitment"),
    pytest.param(lambda key: _committed(tokens.new_private_key()), "is not the key the head list commits to",
                 id="another key committed"),
    pytest.param(lambda key: {"token_key": {**_committed(key)["token_key"], "e": 3}}, "only 65537 is accepted",
                 id="committed e = 3"),
    pytest.param(lambda key: {"token_key": {**_committed(key)["token_key"], "modulus_bits": 4096}},
                 "the head list says 4096", id="committed 4096 bits"),
])
def test_a_key_the_head_list_does_not_commit_to_is_refused(node: str, key: rsa.RSAPrivateKey, headlist: Any,
                                                           expected: str) -> None:
    server = Server(key)
    out = run_device(node, server, blender_message(), headlist=headlist(key))
    assert out["error"]["name"] == "DeviceError", out
    assert expected in out["error"]["message"]
    assert [r["method"] for r in server.requests] == ["GET"], "nothing is posted for a key not committed to"


@pytest.mark.parametrize(("exponent", "bits", "expected"), [
    (3, 2048, "public exponent 3 is not 65537"),
    (65537, 1024, "not a 2048-bit key"),
])
def test_a_bad_exponent_or_a_small_modulus_is_refused(node: str, exponent: int, bits: int, expected: str) -> None:
    weak = rsa.generate_private_key(exponent, bits)
    server = Server(weak)
    out = run_device(node, server, blender_message())  # committed as it is: the device refuses it anyway
    assert out["error"]["name"] == "DeviceError", out
    assert expected in out["error"]["message"]
    assert [r["method"] for r in server.requests] == ["GET"]
