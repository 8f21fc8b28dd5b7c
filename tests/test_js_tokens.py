"""The JavaScript device's report tokens (clients/js/hybriddp-device.js) against :mod:`hybriddp.core.tokens`
(docs/TOKENS.md).

* Fixtures written by Python (tests/tokenhelpers.py), checked by clients/js/test/tokens.test.js under
  ``node --test``: the same payload, challenge and token-input bytes for the same messages, Python's verdict on
  token keys, and from the same random bytes the same blinded message and token (RFC 9578's vectors included).
* Round trips with the JS client's own randomness: tests/js/tokens-driver.mjs runs ``obtainToken`` and this file
  answers its HTTP requests as the server does (``RoundKey.to_dict``, ``tokens.issue``); the token it returns
  passes :class:`TokenVerifier` for its message and for no other, and a tampered or refused issuance is a
  ``DeviceError`` carrying the server's message.

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
from tokenhelpers import token_fixtures

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


def run_device(node: str, server: Server, message: dict[str, Any], credential: str = CREDENTIAL) -> dict[str, Any]:
    """obtainToken in node, its requests answered by ``server``; its last line ({"result"} or {"error"})."""
    proc = subprocess.Popen([node, str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, encoding="utf-8")
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        job = {"base_url": BASE, "round": ROUND, "credential": credential, "message": message}
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
    tokens.TokenVerifier(server.round_key).check(msg, msg["id"], tokens.message_payload(msg), "test")


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
    pytest.param(lambda: {"id": new_message_id(), "round": ROUND, "value": -0.0}, id="mean -0.0"),
    pytest.param(lambda: {"id": new_message_id(), "round": ROUND, "value": 1e-7}, id="mean 1e-7"),
    pytest.param(lambda: {"id": new_message_id(), "round": ROUND, "value": 1.5e300}, id="mean large"),
])
def test_token_from_the_js_device_verifies(node: str, key: rsa.RSAPrivateKey, message: Any) -> None:
    server = Server(key)
    msg = message()
    out = run_device(node, server, msg)
    assert "result" in out, out
    result = out["result"]
    assert {k: v for k, v in result.items() if k != "token"} == msg
    verify(server, result)
    assert [r["method"] for r in server.requests] == ["GET", "POST"]
    assert len(tokens.unb64(server.blinded[0], "blinded", 256)) == 256


def test_token_is_bound_to_its_message(node: str, key: rsa.RSAPrivateKey) -> None:
    server = Server(key)
    msg = run_device(node, server, blender_message())["result"]
    verify(server, msg)
    other_reports = {**msg, "reports": msg["reports"][:2]}
    other_id = {**msg, "id": new_message_id()}
    for other in (other_reports, other_id):
        with pytest.raises(tokens.TokenError, match="does not verify"):
            verify(server, other)
    with pytest.raises(tokens.TokenError, match="does not verify"):  # another round's key
        tokens.TokenVerifier(tokens.round_key("rnd-other", key)).check(msg, msg["id"], tokens.message_payload(msg), "t")


def test_same_message_blinds_differently(node: str, key: rsa.RSAPrivateKey) -> None:
    server = Server(key)
    msg = blender_message()
    first, second = (run_device(node, server, msg)["result"] for _ in range(2))
    assert server.blinded[0] != server.blinded[1]
    assert first["token"] != second["token"]  # PSS with a random salt: both are valid
    verify(server, first)
    verify(server, second)


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
