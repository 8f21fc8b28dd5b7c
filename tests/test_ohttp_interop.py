"""hybriddp's Oblivious HTTP (:mod:`hybriddp.core.ohttp`, RFC 9458) against an implementation written here from
the RFC on a library no one here wrote: tests/interop/ohttp.mjs on `@hpke/core` (npm, pinned in
tests/interop/package.json) and WebCrypto, under node. Both directions: a Python client with the node gateway,
and the node client with a Python gateway; in each the inner messages are binary HTTP (RFC 9292) and the
response must open under the request's context only.

The package is installed by `.ci/run` (`npm ci --prefix tests/interop`); in CI a missing package or node is a
failure. Elsewhere the tests say how to install it and skip."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from hybriddp.core import bhttp, hpke, ohttp
from interophelpers import INTEROP, node_with

SCRIPT = INTEROP / "ohttp.mjs"


@pytest.fixture(scope="module")
def node() -> str:
    return node_with("@hpke/core")


def _js(node: str, *jobs: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the jobs in one node process; bytes go as hex both ways."""
    payload = [{k: v.hex() if isinstance(v, bytes) else v for k, v in job.items()} for job in jobs]
    out = subprocess.run([node, str(SCRIPT)], cwd=INTEROP, input=json.dumps(payload), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout)
    assert len(results) == len(jobs)
    return results


def _request(n: int) -> bytes:
    body = json.dumps({"message": {"id": f"m{n}", "reports": [{"query": "pâte à crêpes 😀"}]}}).encode()
    return bhttp.encode_request("POST", "https", "", "/api/v1/rounds/r1/reports",
                                [("content-type", "application/json"), ("x-n", str(n))], body + os.urandom(n))


def _response(n: int) -> bytes:
    return bhttp.encode_response(200, [("content-type", "application/json")], json.dumps({"ok": n}).encode())


def test_python_client_and_js_gateway(node: str) -> None:
    """(a) Python encapsulates; the node gateway decapsulates and seals a response; Python opens it."""
    key = ohttp.GatewayKey.generate(key_id=0x2A)
    config = ohttp.parse_key_configs(ohttp.encode_key_configs([key.config]))[0]
    sent = [(ohttp.encapsulate_request(config, req), req) for req in (_request(n) for n in (0, 1, 1024))]
    jobs = [{"op": "decapsulate", "sk": hpke.serialize_private_key(key.private_key), "key_id": key.key_id,
             "enc_request": enc_request, "response": _response(i)} for i, ((enc_request, _), _) in enumerate(sent)]
    bad = bytearray(sent[0][0][0])
    bad[-1] ^= 1  # a tampered request: the node gateway refuses it too
    jobs.append({**jobs[0], "enc_request": bytes(bad)})
    results = _js(node, *jobs)
    assert "OpenError" in results[-1]["error"]
    for i, (((_, client), request), res) in enumerate(zip(sent, results[:-1], strict=True)):
        assert "error" not in res, res
        assert bytes.fromhex(res["request"]) == request
        assert bhttp.decode_request(bytes.fromhex(res["request"])).path == "/api/v1/rounds/r1/reports"
        enc_response = bytes.fromhex(res["enc_response"])
        assert client.open_response(enc_response) == _response(i)
        assert bhttp.decode_response(client.open_response(enc_response)).content == json.dumps({"ok": i}).encode()
        other = sent[(i + 1) % len(sent)][0][1]  # the response is bound to its request
        with pytest.raises(ohttp.DecryptError):
            other.open_response(enc_response)


def test_js_client_and_python_gateway(node: str) -> None:
    """(b) node encapsulates against a Python GatewayKey's published config; Python decapsulates and responds;
    node opens the response (and refuses it under another request's context, or tampered)."""
    key = ohttp.GatewayKey.from_bytes(ohttp.GatewayKey.generate(key_id=7).to_bytes())
    keys_body = ohttp.encode_key_configs([key.config])
    requests = [_request(n) for n in (0, 3, 1024)]
    encs = _js(node, *({"op": "encapsulate", "keys": keys_body, "request": r} for r in requests))
    opens = []
    for i, (request, enc) in enumerate(zip(requests, encs, strict=True)):
        assert "error" not in enc, enc
        assert enc["key_id"] == 7
        got, gateway = ohttp.decapsulate_request(key, bytes.fromhex(enc["enc_request"]))
        assert got == request
        assert bhttp.decode_request(got).header("x-n") == str((0, 3, 1024)[i])
        enc_response = gateway.seal_response(_response(i))
        opens.append({"op": "open", "secret": enc["secret"], "enc": enc["enc"], "enc_response": enc_response})
    wrong = {**opens[1], "enc_response": opens[0]["enc_response"]}  # request 0's response under request 1's context
    tampered = bytearray(opens[2]["enc_response"])
    tampered[20] ^= 0x80
    results = _js(node, *opens, wrong, {**opens[2], "enc_response": bytes(tampered)})
    for i, res in enumerate(results[:3]):
        assert bytes.fromhex(res["response"]) == _response(i)
    assert "OperationError" in results[3]["error"] and "OperationError" in results[4]["error"]  # AES-GCM says no


def test_js_client_to_unknown_key_is_refused(node: str) -> None:
    """A request the node client sealed to one key id is refused by a gateway holding another."""
    key = ohttp.GatewayKey.generate(key_id=1)
    (enc,) = _js(node, {"op": "encapsulate", "keys": ohttp.encode_key_configs([key.config]), "request": b"x"})
    other = ohttp.GatewayKey(2, key.private_key)
    with pytest.raises(ohttp.UnknownKeyError, match="key id 1"):
        ohttp.decapsulate_request(other, bytes.fromhex(enc["enc_request"]))
    assert ohttp.decapsulate_request(key, bytes.fromhex(enc["enc_request"]))[0] == b"x"
